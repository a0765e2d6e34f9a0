#include <wrapcert/error.h>
#include <wrapcert/io/detail/pickle.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/io/torch_save.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/paths.h>
#include <wrapcert/test_support/temp_dir.h>

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace wrapcert {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Files written by PyTorch itself (fixtures/golden/torch_save/make_files.py, Debian's
// python3-torch 1.13), with what they must read back as.
std::string file(const std::string& name) {
  return test_support::golden_dir() + "/torch_save/" + name;
}

nlohmann::json expected_reads() {
  std::ifstream in(file("expected.json"));
  return nlohmann::json::parse(in);
}

class TorchSave : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchSave, ReadsWhatPythonSavedKeysShapesDtypesValuesAndTies) {
  const auto state = load_torch_save(file(GetParam()));
  const auto want = expected_reads();
  EXPECT_EQ(keys(state), want["keys"].get<std::vector<std::string>>());
  for (const auto& item : state) {
    const auto& w = want["tensors"][item.key()];
    EXPECT_EQ(item.value().sizes().vec(), w["shape"].get<std::vector<int64_t>>()) << item.key();
    EXPECT_EQ(std::string(c10::toString(item.value().scalar_type())) == "Long" ? "int64"
              : item.value().scalar_type() == c10::kDouble                     ? "float64"
                                                                               : "float32",
              w["dtype"].get<std::string>())
        << item.key();
    const auto values = w["values"].get<std::vector<double>>();
    const auto got = item.value().to(torch::kDouble).flatten();
    ASSERT_EQ(got.numel(), static_cast<int64_t>(values.size())) << item.key();
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(got[static_cast<int64_t>(i)].item<double>(), values[i])
          << item.key() << "[" << i << "]";
    }
  }
  EXPECT_EQ(state["embed.weight"].data_ptr(), state["head.weight"].data_ptr())
      << "the tied weights share one storage";
}

INSTANTIATE_TEST_SUITE_P(PythonFiles, TorchSave,
                         ::testing::Values("state_dict.pt", "plain_dict.pt"), [](const auto& info) {
                           return info.param == "state_dict.pt"
                                      ? std::string("OrderedDictWithMetadata")
                                      : std::string("PlainDict");
                         });

TEST(TorchSaveDamage, TruncatedAndForeignFilesAreClearErrors) {
  for (const char* name : {"truncated.pt", "expected.json"}) {
    EXPECT_THAT([&] { (void)load_torch_save(file(name)); },
                ThrowsError(ErrorCode::kMalformedInput, _, HasSubstr(name)));
  }
}

}  // namespace
}  // namespace wrapcert

namespace wrapcert {
namespace {

TEST(PythonWrittenSafetensors, ReadsBackTheSameTensors) {
  const auto saved = load_torch_save(file("state_dict.pt"));
  const auto loaded = load_safetensors(file("python_written.safetensors"));
  EXPECT_EQ(read_safetensors_header(file("python_written.safetensors")).metadata.at("format"),
            "pt");
  EXPECT_EQ(loaded.size(), saved.size() - 1) << "head.weight is stored once, under embed.weight";
  for (const auto& item : loaded) {
    ASSERT_TRUE(saved.contains(item.key())) << item.key();
    EXPECT_TRUE(item.value().equal(saved[item.key()])) << item.key();
  }
}

}  // namespace
}  // namespace wrapcert

namespace wrapcert {
namespace {

/// Pickles written opcode by opcode, for what PyTorch never writes but a damaged or hostile
/// file may hold.
struct Pickle {
  std::string bytes = "\x80\x02";  // PROTO 2
  Pickle& op(const std::string& s) {
    bytes += s;
    return *this;
  }
  Pickle& str(const std::string& s) {
    bytes += 'X';
    for (int i = 0; i < 4; ++i) bytes += static_cast<char>((s.size() >> (8 * i)) & 0xff);
    bytes += s;
    return *this;
  }
  Pickle& small(int v) { return op(std::string{'K', static_cast<char>(v)}); }
  /// A float storage "key" of `numel` elements (BINPERSID).
  Pickle& storage(const std::string& key, int numel) {
    op("(").str("storage").op("ctorch\nFloatStorage\n").str(key).str("cpu").small(numel);
    return op("tQ");
  }
  /// _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()).
  Pickle& tensor(const std::string& key, int numel, int offset, const std::vector<int>& size,
                 const std::vector<int>& stride) {
    op("ctorch._utils\n_rebuild_tensor_v2\n(");
    storage(key, numel).small(offset).op("(");
    for (int s : size) small(s);
    op("t(");
    for (int s : stride) small(s);
    return op("t\x89").op("ccollections\nOrderedDict\n)R").op("tR");
  }
};

StateDict run(const Pickle& p) {
  return detail::read_state_dict_pickle(p.bytes.data(), p.bytes.size(), "test.pkl").state;
}

void expect_malformed(const Pickle& p, const std::string& key, const std::string& what) {
  EXPECT_THAT([&] { (void)run(p); }, ThrowsError(ErrorCode::kMalformedInput, key, HasSubstr(what)));
}

TEST(TorchSavePickle, ReadsAHandWrittenStateDict) {
  Pickle p;
  p.op("}").str("w").tensor("0", 4, 0, {2, 2}, {2, 1}).op("s.");
  const auto state = run(p);
  ASSERT_EQ(keys(state), std::vector<std::string>{"w"});
  EXPECT_EQ(state["w"].sizes(), (std::vector<int64_t>{2, 2}));
}

TEST(TorchSavePickle, RefusesViewsOutsideTheirStorage) {
  Pickle reach;
  reach.op("}").str("w").tensor("0", 4, 1, {2, 2}, {2, 1}).op("s.");
  expect_malformed(reach, "", "reaches past its storage");
  Pickle empty;  // a view of elements of an empty storage
  empty.op("}").str("w").tensor("e", 0, 0, {1}, {1}).op("s.");
  expect_malformed(empty, "", "reaches past its storage");
  Pickle ranks;  // two sizes, one stride
  ranks.op("}").str("w").tensor("0", 4, 0, {2, 2}, {1}).op("s.");
  expect_malformed(ranks, "", "one length expected");
  Pickle negative;  // a stride of -1 (BININT)
  negative.op("}").str("w").tensor("0", 4, 0, {2}, {}).op("s.");
  negative.bytes.replace(negative.bytes.find("t(t"), 3, std::string("t(J\xff\xff\xff\xfft", 8));
  expect_malformed(negative, "", "a stride that is not a non-negative integer");
}

TEST(TorchSavePickle, RefusesAKeySavedTwice) {
  Pickle p;
  p.op("}(").str("w").tensor("0", 4, 0, {4}, {1}).str("w").tensor("0", 4, 0, {4}, {1}).op("u.");
  expect_malformed(p, "w", "saved twice");
}

std::string renamed(const Pickle& p, const std::vector<std::pair<std::string, std::string>>& r,
                    const std::string& entry = "") {
  const auto pickled =
      detail::read_state_dict_pickle(p.bytes.data(), p.bytes.size(), "test.pkl", entry);
  return detail::rename_pickled_keys(p.bytes.data(), pickled, r, "test.pkl");
}

/// {"model": {KEY: tensor}, "optimizer": {"lr": 0.5, "names": ["w"]}, "epoch": 3}
Pickle trainer(const std::string& key) {
  Pickle p;
  p.op("}(").str("model").op("}").str(key).tensor("0", 4, 0, {4}, {1}).op("s");
  p.str("optimizer").op("}(").str("lr").op(std::string("G?\xe0\0\0\0\0\0\0", 9));
  p.str("names").op("]").str("w").op("au");
  return p.str("epoch").small(3).op("u.");
}

TEST(TorchSavePickle, RenamingAKeyChangesItsStringAndNoOtherByte) {
  EXPECT_EQ(renamed(trainer("_orig_mod.w"), {{"_orig_mod.w", "w"}}), trainer("w").bytes);
  EXPECT_EQ(renamed(trainer("w"), {{"w", "a.much.longer.name"}}),
            trainer("a.much.longer.name").bytes);
  EXPECT_EQ(renamed(trainer("w"), {{"other", "x"}}), trainer("w").bytes);
}

TEST(TorchSavePickle, RenamingDropsFramesWhoseLengthsWouldNoLongerHold) {
  Pickle framed;  // protocol 4 frames: a FRAME opcode and an 8-byte length before the rest
  framed.bytes = "\x80\x04";
  framed.op(std::string("\x95\x10\0\0\0\0\0\0\0", 9)).op("}").str("ab");
  framed.tensor("0", 4, 0, {4}, {1}).op("s.");
  Pickle plain;
  plain.bytes = "\x80\x04";
  plain.op("}").str("b").tensor("0", 4, 0, {4}, {1}).op("s.");
  EXPECT_EQ(renamed(framed, {{"ab", "b"}}), plain.bytes);
}

TEST(TorchSavePickle, RefusesToRenameAKeyWhoseStringIsReferredToAgain) {
  Pickle p;  // {"model": {"w": t}, "names": [<the same "w", through the memo>]}
  p.op("}(").str("model").op("}").str("w").op(std::string("q\0", 2));
  p.tensor("0", 4, 0, {4}, {1}).op("s").str("names").op(std::string("]h\0au.", 6));
  EXPECT_THAT(
      [&] {
        renamed(p, {{"w", "x"}});
      },
      ThrowsError(ErrorCode::kMalformedInput, "w", HasSubstr("elsewhere too")));
  EXPECT_NO_THROW(renamed(p, {{"w", "w"}}));
}

TEST(TorchSavePickle, ExtraStateThatIsNoTensorIsKeptAsAKey) {
  Pickle p;  // {"w": tensor, "block._extra_state": 5, "head._extra_state": b"fp8"}
  p.op("}(").str("w").tensor("0", 4, 0, {4}, {1}).str("block._extra_state").small(5);
  p.str("head._extra_state")
      .op("C\x03"
          "fp8")
      .op("u.");
  const auto state = run(p);
  EXPECT_EQ(keys(state),
            std::vector<std::string>({"w", "block._extra_state", "head._extra_state"}));
  EXPECT_FALSE(state["block._extra_state"].defined());
  Pickle bad;  // the same value under a key that is no extra state
  bad.op("}(").str("w").tensor("0", 4, 0, {4}, {1}).str("block.scale").small(5).op("u.");
  expect_malformed(bad, "block.scale", "not a state dict");
}

TEST(TorchSavePickle, AShardedTensorIsNamedWithTheWayOut) {
  Pickle p;  // {"w": ShardedTensor.__new__(ShardedTensor)} with its state
  p.op("}").str("w").op("ctorch.distributed._shard.sharded_tensor.api\nShardedTensor\n)\x81");
  p.op("}b").op("s.");
  EXPECT_THAT([&] { (void)run(p); },
              ThrowsError(ErrorCode::kUnsupported, "w", HasSubstr("FULL_STATE_DICT")));
}

TEST(TorchSavePickle, ASelfContainingListNeitherLeaksNorRecurses) {
  Pickle p;  // l = []; l.append(l); {"l": l}
  p.op("}").str("l").op(std::string("]q\0h\0", 5)).op("as.");
  expect_malformed(p, "l", "entry 'l' holds a list");
  Pickle deep;  // a million nested 1-tuples
  deep.op("N");
  for (int i = 0; i < 1000000; ++i) deep.op("\x85");
  deep.op(".");
  expect_malformed(deep, "", "holds a tuple, not a dict");
}

TEST(TorchSavePickle, NestedDictsOfTensorsGiveDottedKeysAndRenameTheirLastPart) {
  // {"model": {"lm": {"emb": {"weight": t}, "enc": {"module.w": t}}}, "epoch": 3}, as Megatron
  auto megatron = [](const std::string& inner) {
    Pickle p;
    p.op("}(").str("model").op("}").str("lm").op("}(").str("emb").op("}").str("weight");
    p.tensor("0", 4, 0, {4}, {1}).op("s").str("enc").op("}").str(inner);
    p.tensor("1", 4, 0, {4}, {1}).op("su").op("s").str("epoch").small(3);
    return p.op("u.");
  };
  const auto pickled = detail::read_state_dict_pickle(megatron("module.w").bytes.data(),
                                                      megatron("module.w").bytes.size(), "m.pt");
  EXPECT_EQ(pickled.entry, "model");
  EXPECT_EQ(keys(pickled.state), std::vector<std::string>({"lm.emb.weight", "lm.enc.module.w"}));
  EXPECT_EQ(renamed(megatron("module.w"), {{"lm.enc.module.w", "lm.enc.w"}}), megatron("w").bytes);
  EXPECT_THAT(
      [&] {
        renamed(megatron("module.w"), {{"lm.enc.module.w", "lm.w"}});
      },
      ThrowsError(ErrorCode::kUnsupported, "lm.enc.module.w",
                  HasSubstr("renames only the last part")));
}

TEST(TorchSavePickle, EveryStateDictBesideTheChosenOneIsListed) {
  Pickle p;  // {"state_dict": {"w": t}, "epoch": 3, "state_dict_ema": {"w": t2}, "cfg": {}}
  p.op("}(").str("state_dict").op("}").str("w").tensor("0", 4, 0, {4}, {1}).op("s");
  p.str("epoch").small(3).str("state_dict_ema").op("}").str("w");
  p.tensor("1", 4, 0, {4}, {1}).op("s").str("cfg").op("}u.");
  const auto pickled = detail::read_state_dict_pickle(p.bytes.data(), p.bytes.size(), "t.pt");
  EXPECT_EQ(pickled.entry, "state_dict");
  EXPECT_EQ(pickled.more_state_dicts, std::vector<std::string>{"state_dict_ema"});
  EXPECT_EQ(pickled.other_entries, std::vector<std::string>({"epoch", "cfg"}));
  const auto ema =
      detail::read_state_dict_pickle(p.bytes.data(), p.bytes.size(), "t.pt", "state_dict_ema");
  EXPECT_TRUE(ema.more_state_dicts.empty()) << "an entry asked for is read alone";
}

TEST(TorchSavePickle, ADictInsideItselfIsLookedAtOnce) {
  Pickle p;  // d = {}; d["a".."t"] = d (20 keys); {"model": d}: 20^16 walks if not
  p.op("}(").str("model").op("}").op(std::string("q\0(", 3));
  for (char c = 'a'; c <= 't'; ++c) p.str(std::string(1, c)).op(std::string("h\0", 2));
  p.op("uu.");
  expect_malformed(p, "model", "not a state dict");
}

TEST(TorchSavePickle, APickledModuleIsNamedWithTheWayOut) {
  Pickle p;  // Net.__new__(Net) with {"_parameters": {}, "_modules": {}} as its state
  p.op("c__main__\nNet\n)\x81}(").str("_parameters").op("}").str("_modules").op("}ub.");
  EXPECT_THAT([&] { (void)run(p); },
              ThrowsError(ErrorCode::kUnsupported, "",
                          AllOf(HasSubstr("a pickled module of class '__main__.Net'"),
                                HasSubstr("state_dict()"))));
}

TEST(TorchSaveZip, EveryStorageIsInTheArchiveWithItsExactSize) {
  test_support::TempDir dir;
  Pickle p;
  p.op("}").str("w").tensor("0", 4, 0, {4}, {1}).op("s.");
  auto archive = [&](const std::string& name, const std::map<std::string, std::string>& records) {
    caffe2::serialize::PyTorchStreamWriter writer(dir / name);
    writer.writeRecord("data.pkl", p.bytes.data(), p.bytes.size());
    for (const auto& [record, bytes] : records) {
      writer.writeRecord(record, bytes.data(), bytes.size());
    }
    writer.writeEndOfFile();
    return dir / name;
  };
  const auto good = read_torch_save(archive("good.pt", {{"data/0", std::string(16, '\0')}}));
  EXPECT_TRUE(good.state["w"].equal(torch::zeros({4})));
  const auto short_record = archive("short.pt", {{"data/0", std::string(12, '\0')}});
  EXPECT_THAT(
      [&] {
        read_torch_save(short_record, {/*data=*/false, ""});
      },
      ThrowsError(ErrorCode::kMalformedInput, _,
                  HasSubstr("storage data/0 holds 12 bytes, not 4 elements of 4")));
  const auto lacking = archive("lacking.pt", {});
  EXPECT_THAT(
      [&] {
        read_torch_save(lacking, {/*data=*/false, ""});
      },
      ThrowsError(ErrorCode::kMalformedInput, _, HasSubstr("lacks storage data/0")));
}

TEST(TorchSaveZip, ADamagedRecordIsFoundWhenItsDataIsRead) {
  test_support::TempDir dir;
  const auto copy = dir / "tied.pt";
  std::filesystem::copy_file(test_support::golden_dir() + "/checkpoints/tied.pt", copy);
  const auto offset = caffe2::serialize::PyTorchStreamReader(copy).getRecordOffset("data/0");
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put('\x7f');
  }
  EXPECT_THAT([&] { read_torch_save(copy); },
              ThrowsError(ErrorCode::kMalformedInput, _, HasSubstr("record data/0 is damaged")));
}

}  // namespace
}  // namespace wrapcert
