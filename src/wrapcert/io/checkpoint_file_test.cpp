#include <wrapcert/error.h>
#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/io/torch_save.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/paths.h>
#include <wrapcert/test_support/temp_dir.h>

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;
using test_support::ThrowsError;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Checkpoints written by PyTorch 1.13 itself (fixtures/golden/checkpoints/make_files.py), with
// what PyTorch reads back from each.
std::string golden(const std::string& name) {
  return test_support::golden_dir() + "/checkpoints/" + name;
}

const nlohmann::json& expected() {
  static const nlohmann::json j = [] {
    std::ifstream in(golden("expected.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::string format_name(const std::string& recorded) {
  return recorded == "zip"      ? "torch.save zip"
         : recorded == "legacy" ? "torch.save legacy"
                                : recorded;
}

std::vector<std::vector<std::string>> sorted_groups(std::vector<std::vector<std::string>> groups) {
  for (auto& g : groups) std::sort(g.begin(), g.end());
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::vector<double> values(const torch::Tensor& t) {
  const auto flat = t.to(torch::kDouble).contiguous().flatten();
  return {flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel()};
}

std::string dtype_name(c10::ScalarType type) {
  static const std::map<c10::ScalarType, std::string> names = {
      {c10::kFloat, "float32"},     {c10::kDouble, "float64"}, {c10::kHalf, "float16"},
      {c10::kBFloat16, "bfloat16"}, {c10::kLong, "int64"},     {c10::kInt, "int32"},
      {c10::kShort, "int16"},       {c10::kChar, "int8"},      {c10::kByte, "uint8"},
      {c10::kBool, "bool"}};
  return names.at(type);
}

/// What PyTorch read, against what wrapcert read (with data, or only the layout).
void expect_as_recorded(const Checkpoint& c, const nlohmann::json& want, bool data) {
  EXPECT_EQ(keys(c.state), want["keys"].get<std::vector<std::string>>());
  EXPECT_EQ(c.format, format_name(want["format"].get<std::string>()));
  EXPECT_EQ(c.entry, want["entry"].get<std::string>());
  for (const auto& item : c.state) {
    SCOPED_TRACE(item.key());
    const auto& w = want["tensors"][item.key()];
    const auto& t = item.value();
    EXPECT_EQ(t.is_meta(), !data);
    EXPECT_EQ(t.sizes().vec(), w["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.strides().vec(), w["stride"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.storage_offset(), w["storage_offset"].get<int64_t>());
    EXPECT_EQ(dtype_name(t.scalar_type()), w["dtype"].get<std::string>());
    if (data) {
      EXPECT_EQ(values(t), w["values"].get<std::vector<double>>());
    }
  }
  EXPECT_EQ(sorted_groups(storage_ties(c.state)),
            sorted_groups(want["ties"].get<std::vector<std::vector<std::string>>>()));
}

class GoldenCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenCheckpoint, ReadsKeysLayoutsValuesAndTiesAsPyTorchDoes) {
  const auto& want = expected()["files"][GetParam()];
  expect_as_recorded(read_checkpoint(golden(GetParam())), want, /*data=*/true);
}

TEST_P(GoldenCheckpoint, ListsTheSameWithoutReadingTensorData) {
  const auto& want = expected()["files"][GetParam()];
  expect_as_recorded(read_checkpoint(golden(GetParam()), {/*data=*/false, ""}), want,
                     /*data=*/false);
}

INSTANTIATE_TEST_SUITE_P(PyTorch113, GoldenCheckpoint,
                         ::testing::Values("ddp.pt", "checkpoint_wrapper.pt",
                                           "checkpoint_wrapper_state_dict.pt", "trainer.pt",
                                           "deepspeed.pt", "lightning.ckpt", "legacy.pt",
                                           "legacy_trainer.pt", "dtypes.pt", "views.pt", "tied.pt",
                                           "sharded_bin", "sharded_safetensors",
                                           "clean_state_dict.pt"),
                         [](const auto& info) {
                           std::string name;
                           for (char c : info.param)
                             name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(CheckpointFile, SaysWhichEntryHeldTheStateDictAndWhatElseIsThere) {
  const auto trainer = read_checkpoint(golden("trainer.pt"), {false, ""});
  EXPECT_EQ(trainer.entry, "model");
  EXPECT_THAT(trainer.other_entries, ElementsAre("optimizer", "epoch", "best_loss"));
  EXPECT_EQ(read_checkpoint(golden("trainer.pt"), {false, "model"}).state.size(), 8u);
  EXPECT_EQ(read_checkpoint(golden("lightning.ckpt"), {false, ""}).entry, "state_dict");
  EXPECT_EQ(read_checkpoint(golden("deepspeed.pt"), {false, ""}).entry, "module");
}

TEST(CheckpointFile, AWrongEntryNamesWhatIsThere) {
  EXPECT_THAT(
      [] {
        read_checkpoint(golden("trainer.pt"), {false, "weights"});
      },
      ThrowsError(ErrorCode::kMalformedInput, "weights",
                  HasSubstr("no entry 'weights' (entries: model, optimizer, epoch, best_loss)")));
  EXPECT_THAT(
      [] {
        read_checkpoint(golden("trainer.pt"), {false, "epoch"});
      },
      ThrowsError(ErrorCode::kMalformedInput, "epoch", HasSubstr("holds an int, not a dict")));
  EXPECT_THAT(
      [] {
        read_checkpoint(golden("trainer.pt"), {false, "optimizer"});
      },
      ThrowsError(ErrorCode::kMalformedInput, "state", HasSubstr("not a tensor")));
  EXPECT_THAT(
      [] {
        read_checkpoint(golden("trainer.pt"), {false, "model.module.steps"});
      },
      ThrowsError(ErrorCode::kMalformedInput, "model.module",
                  HasSubstr("no entry 'module' in 'model' (entries: module.steps")));
}

TEST(CheckpointFile, AShardedCheckpointIsReadByItsIndexOrItsFolder) {
  const auto by_folder = read_checkpoint(golden("sharded_bin"), {false, ""});
  const auto by_index = read_checkpoint(golden("sharded_bin/pytorch_model.bin.index.json"));
  EXPECT_EQ(keys(by_folder.state), keys(by_index.state));
  EXPECT_EQ(by_index.index, golden("sharded_bin/pytorch_model.bin.index.json"));
  ASSERT_EQ(by_index.shards.size(), 2u);
  EXPECT_THAT(by_index.shards[1].keys, ElementsAre("module.block.0.weight", "module.block.0.bias",
                                                   "module.block.1.weight", "module.block.1.bias"));
  EXPECT_TRUE(by_index.sharded());
  EXPECT_EQ(by_index.files().size(), 3u);
}

TEST(CheckpointFile, VariantsBesideTheWeightsAreCheckpointsOfTheirOwn) {
  test_support::TempDir dir;
  StateDict full, half;
  full.insert("w", torch::ones({2, 2}));
  half.insert("w", torch::ones({2, 2}, torch::kHalf));
  save_safetensors(dir / "model.safetensors", full);
  save_safetensors(dir / "model.fp16.safetensors", half);
  // Sharded variants are read through their index, whose shards are not variants alone.
  std::ofstream(dir / "model.safetensors.index.fp16.json") << "{}";
  save_safetensors(dir / "model.fp16-00001-of-00001.safetensors", half);
  const auto c = read_checkpoint(dir.path().string(), {false, ""});
  EXPECT_EQ(c.shards.size(), 1u);
  EXPECT_EQ(c.state["w"].scalar_type(), torch::kFloat);
  EXPECT_THAT(c.variants, ElementsAre(dir / "model.fp16.safetensors",
                                      dir / "model.safetensors.index.fp16.json"));
  EXPECT_THAT(c.not_read, ElementsAre("model.fp16-00001-of-00001.safetensors"));
  // A name with a dot is a variant only beside the file it is a variant of.
  test_support::TempDir meta;
  save_safetensors(meta / "consolidated.00.safetensors", full);
  const auto alone = read_checkpoint(meta.path().string(), {false, ""});
  EXPECT_EQ(alone.shards.size(), 1u);
  EXPECT_TRUE(alone.variants.empty());
}

/// A copy of the sharded .bin checkpoint whose index says `weight_map`.
class DamagedIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& e : fs::directory_iterator(golden("sharded_bin"))) {
      fs::copy_file(e.path(), dir_.path() / e.path().filename());
    }
    std::ifstream in(index());
    index_ = nlohmann::ordered_json::parse(in);
  }
  std::string index() const { return dir_ / "pytorch_model.bin.index.json"; }
  void write_index(const std::string& text) const { std::ofstream(index()) << text; }
  void write_index() const { write_index(index_.dump()); }

  test_support::TempDir dir_;
  nlohmann::ordered_json index_;
};

TEST_F(DamagedIndex, AKeyMissingFromTheWeightMapIsNamed) {
  index_["weight_map"].erase("module.steps");
  write_index();
  EXPECT_THAT(
      [&] { read_checkpoint(index()); },
      ThrowsError(ErrorCode::kMalformedInput, "module.steps",
                  HasSubstr("in shard pytorch_model-00001-of-00002.bin but missing from the "
                            "weight_map")));
}

TEST_F(DamagedIndex, AKeyPlacedInTheWrongShardIsNamed) {
  index_["weight_map"]["module.steps"] = "pytorch_model-00002-of-00002.bin";
  write_index();
  EXPECT_THAT(
      [&] { read_checkpoint(dir_.path().string()); },
      ThrowsError(ErrorCode::kMalformedInput, "module.steps",
                  HasSubstr("the weight_map places it in pytorch_model-00002-of-00002.bin")));
}

TEST_F(DamagedIndex, AKeyTheShardLacksIsNamed) {
  index_["weight_map"]["module.extra"] = "pytorch_model-00002-of-00002.bin";
  write_index();
  EXPECT_THAT([&] { read_checkpoint(index()); },
              ThrowsError(ErrorCode::kMalformedInput, "module.extra", HasSubstr("which lacks it")));
}

TEST_F(DamagedIndex, AShardOutsideTheFolderOrMissingIsRefused) {
  index_["weight_map"]["module.steps"] = "../pytorch_model-00001-of-00002.bin";
  write_index();
  EXPECT_THAT(
      [&] { read_checkpoint(index()); },
      ThrowsError(ErrorCode::kMalformedInput, "module.steps", HasSubstr("not a file name")));
  index_["weight_map"]["module.steps"] = "gone.bin";
  write_index();
  EXPECT_THAT(
      [&] { read_checkpoint(index()); },
      ThrowsError(ErrorCode::kMalformedInput, "module.steps",
                  HasSubstr("in shard gone.bin, which is not a file in the index's folder")));
}

TEST_F(DamagedIndex, ARepeatedKeyInTheIndexIsDamage) {
  write_index(R"({"weight_map": {"module.steps": "pytorch_model-00001-of-00002.bin",
                  "module.steps": "pytorch_model-00002-of-00002.bin"}})");
  EXPECT_THAT(
      [&] { read_checkpoint(index()); },
      ThrowsError(ErrorCode::kMalformedInput, "weight_map.module.steps", HasSubstr("twice")));
}

TEST_F(DamagedIndex, AFolderWithoutIndexRefusesAKeyInTwoShards) {
  fs::remove(index());
  fs::copy_file(dir_ / "pytorch_model-00001-of-00002.bin", dir_ / "pytorch_model-extra.bin");
  EXPECT_THAT([&] { read_checkpoint(dir_.path().string()); },
              ThrowsError(ErrorCode::kMalformedInput, "module.steps", HasSubstr("in two shards")));
}

TEST(CheckpointFile, InputsThatAreNotRegularFilesAreRefusedByType) {
  test_support::TempDir dir;
  const auto fifo = dir / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT([&] { read_checkpoint(fifo); },
              ThrowsError(ErrorCode::kInvalidArgument, fifo,
                          HasSubstr("it is a FIFO, not a checkpoint file")));
  EXPECT_THAT([&] { read_safetensors_header(fifo); },
              ThrowsError(ErrorCode::kInvalidArgument, fifo, HasSubstr("it is a FIFO")));
  EXPECT_THAT([&] { read_torch_save(fifo); },
              ThrowsError(ErrorCode::kInvalidArgument, fifo, HasSubstr("is a FIFO")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "a FIFO hung";
  EXPECT_THAT(
      [] { read_checkpoint("/dev/null"); },
      ThrowsError(ErrorCode::kInvalidArgument, "/dev/null", HasSubstr("a character device")));
  EXPECT_THAT(
      [&] { read_safetensors_header(dir.path().string()); },
      ThrowsError(ErrorCode::kInvalidArgument, dir.path().string(), HasSubstr("is a directory")));
  EXPECT_THAT([&] { read_checkpoint(dir.path().string() + "/none"); },
              ThrowsError(ErrorCode::kInvalidArgument, dir.path().string() + "/none",
                          HasSubstr("No such file")));
  fs::remove(fifo);
  EXPECT_THAT([&] { read_checkpoint(dir.path().string()); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("no checkpoint file")));
}

TEST(CheckpointFile, UnknownFormatsAreNamed) {
  test_support::TempDir dir;
  std::ofstream(dir / "notes.pt") << "not a checkpoint at all, just some words";
  EXPECT_THAT([&] { read_checkpoint(dir / "notes.pt"); },
              ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("not a torch.save file")));
  // Tar archives, the pre-0.4 torch.save format among them: tar_archive_test.cpp.
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CheckpointFile, TheLegacyFormatIsValidatedToItsLastByte) {
  test_support::TempDir dir;
  const auto bytes = read_bytes(golden("legacy.pt"));
  std::ofstream(dir / "trailing.pt", std::ios::binary) << bytes << "extra";
  EXPECT_THAT(
      [&] { read_checkpoint(dir / "trailing.pt"); },
      ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("5 bytes follow the last storage")));
  std::ofstream(dir / "short.pt", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  EXPECT_THAT(
      [&] {
        read_checkpoint(dir / "short.pt", {false, ""});
      },
      ThrowsError(ErrorCode::kMalformedInput, "", HasSubstr("ends inside storage")));
}

TEST(CheckpointFile, WritesEachFormatWithTiesViewsAndValuesKept) {
  test_support::TempDir dir;
  const auto views = read_checkpoint(golden("views.pt"));
  for (const char* name : {"views.pt", "views.safetensors"}) {
    SCOPED_TRACE(name);
    write_checkpoint(dir / name, views);
    const auto back = read_checkpoint(dir / name);
    EXPECT_EQ(keys(back.state), keys(views.state));
    EXPECT_EQ(storage_ties(back.state), storage_ties(views.state));
    for (const auto& item : views.state) {
      EXPECT_TRUE(back.state[item.key()].equal(item.value())) << item.key();
      if (std::string(name) == "views.pt") {
        EXPECT_EQ(back.state[item.key()].strides(), item.value().strides()) << item.key();
      }
    }
  }
  EXPECT_EQ(read_checkpoint(dir / "views.safetensors").format, "safetensors");
  EXPECT_EQ(read_checkpoint(dir / "views.pt").format, "torch.save zip");
}

TEST(CheckpointFile, AShardedCheckpointIsWrittenAsShardsWithAnIndex) {
  test_support::TempDir dir;
  const auto sharded = rename_keys(read_checkpoint(golden("sharded_bin")),
                                   {{"module.steps", "steps"}, {"module.head.weight", "head"}});
  const auto index = dir / "model.safetensors.index.json";
  EXPECT_THAT(planned_files(index, sharded),
              ElementsAre(dir / "pytorch_model-00001-of-00002.safetensors",
                          dir / "pytorch_model-00002-of-00002.safetensors", index));
  write_checkpoint(index, sharded);
  const auto back = read_checkpoint(dir.path().string());
  EXPECT_EQ(keys(back.state), keys(sharded.state));
  EXPECT_THAT(back.shards[0].keys,
              ElementsAre("steps", "module.scale_t", "module.embed.weight", "head"));
  EXPECT_EQ(storage_ties(back.state), storage_ties(sharded.state));
  std::ifstream in(index);
  const auto written = nlohmann::json::parse(in);
  EXPECT_EQ(written["weight_map"]["head"], "pytorch_model-00001-of-00002.safetensors");
  EXPECT_EQ(written["metadata"]["total_size"], 172);
}

/// The keys of a checkpoint whose wrapper prefix "module." is dropped.
std::vector<std::pair<std::string, std::string>> without_module(const Checkpoint& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& item : c.state) {
    if (item.key().rfind("module.", 0) == 0) out.emplace_back(item.key(), item.key().substr(7));
  }
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Every file in `folder`, by name, with its bytes.
std::map<std::string, std::string> folder_bytes(const std::string& folder) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(folder)) {
    out[e.path().filename().string()] = file_bytes(e.path().string());
  }
  return out;
}

/// `folder` holds a checkpoint that reads whole with the keys and values of `want`, renamed or
/// not; nothing of a half-written one.
void expect_loads_as(const std::string& folder, const Checkpoint& want, bool renamed) {
  const auto back = read_checkpoint(folder);
  std::vector<std::string> keys_wanted;
  for (const auto& item : want.state) {
    keys_wanted.push_back(renamed && item.key().rfind("module.", 0) == 0 ? item.key().substr(7)
                                                                         : item.key());
  }
  ASSERT_EQ(keys(back.state), keys_wanted);
  size_t i = 0;
  for (const auto& item : want.state) {
    EXPECT_TRUE(back.state[keys_wanted[i++]].equal(item.value())) << item.key();
  }
}

TEST(RewriteTorchSave, KeepsEveryOtherByteOfALegacyTrainerCheckpoint) {
  test_support::TempDir dir;
  const auto source = golden("legacy_trainer.pt");
  const auto listing = read_checkpoint(source, {false, ""});
  const auto renames = without_module(listing);
  rewrite_torch_save(source, dir / "fixed.pt", renames, listing.entry);
  const auto fixed = read_checkpoint(dir / "fixed.pt");
  EXPECT_EQ(fixed.entry, "model");
  EXPECT_EQ(fixed.other_entries, listing.other_entries);
  EXPECT_EQ(keys(fixed.state).front(), "steps");
  // Renamed back, the file is the original to the byte: only the key strings were touched.
  std::vector<std::pair<std::string, std::string>> back;
  for (const auto& [from, to] : renames) back.emplace_back(to, from);
  rewrite_torch_save(dir / "fixed.pt", dir / "back.pt", back, "model");
  EXPECT_EQ(file_bytes(dir / "back.pt"), file_bytes(source));
}

TEST(RewriteTorchSave, KeepsTheOptimizerAndEveryRecordOfAZipTrainerCheckpoint) {
  test_support::TempDir dir;
  const auto source = golden("trainer.pt");
  const auto listing = read_checkpoint(source, {false, ""});
  rewrite_torch_save(source, dir / "fixed.pt", without_module(listing), listing.entry);
  const auto original = read_checkpoint(source);
  expect_loads_as(dir / "fixed.pt", original, /*renamed=*/true);
  EXPECT_EQ(read_checkpoint(dir / "fixed.pt", {false, ""}).other_entries,
            std::vector<std::string>({"optimizer", "epoch", "best_loss"}));
  // Renamed back through the archive writer, every record holds what it held.
  std::vector<std::pair<std::string, std::string>> back;
  for (const auto& [from, to] : without_module(listing)) back.emplace_back(to, from);
  rewrite_torch_save(dir / "fixed.pt", dir / "back.pt", back, "model");
  caffe2::serialize::PyTorchStreamReader a(source), b(dir / "back.pt");
  auto records = a.getAllRecords();
  std::sort(records.begin(), records.end());
  auto records_back = b.getAllRecords();
  std::sort(records_back.begin(), records_back.end());
  EXPECT_EQ(records_back, records);
  for (const auto& name : records) {
    auto [x, nx] = a.getRecord(name);
    auto [y, ny] = b.getRecord(name);
    ASSERT_EQ(nx, ny) << name;
    EXPECT_EQ(std::memcmp(x.get(), y.get(), nx), 0) << name;
  }
}

/// A copy of the golden sharded checkpoint (PyTorch 1.13, keys under "module.") to fix in place.
class ShardedInPlace : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { copy_golden(); }
  /// The folder as PyTorch wrote it again, listed and read.
  void copy_golden() {
    for (const auto& e : fs::directory_iterator(dir_.path())) fs::remove(e.path());
    for (const auto& e : fs::directory_iterator(golden(GetParam()))) {
      fs::copy_file(e.path(), dir_.path() / e.path().filename());
    }
    listing_ = read_checkpoint(folder(), {false, ""});
    original_ = read_checkpoint(folder());
    renames_ = without_module(listing_);
    ASSERT_FALSE(renames_.empty());
  }
  std::string folder() const { return dir_.path().string(); }
  std::string index() const { return listing_.index; }
  /// Fixes the copy in place, calling `step` with each path as it lands.
  void fix(const std::function<void(const std::string&)>& step = {}) const {
    write_fixed_checkpoint(index(), listing_, renames_, {step});
  }

  test_support::TempDir dir_;
  Checkpoint listing_, original_;
  std::vector<std::pair<std::string, std::string>> renames_;
};

TEST_P(ShardedInPlace, FixesEveryShardAndTheIndexAndLeavesNothingBehind) {
  std::vector<std::string> steps;
  fix([&steps](const std::string& path) { steps.push_back(fs::path(path).filename().string()); });
  expect_loads_as(folder(), original_, /*renamed=*/true);
  const auto names = folder_bytes(folder());
  std::vector<std::string> files;
  for (const auto& [name, bytes] : names) files.push_back(name);
  std::vector<std::string> before;
  for (const auto& e : fs::directory_iterator(golden(GetParam()))) {
    before.push_back(e.path().filename().string());
  }
  std::sort(before.begin(), before.end());
  EXPECT_EQ(files, before);  // no temporary file left
  // Two shards under temporary names, the index naming them, each shard linked, the index.
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_THAT(steps[0], ::testing::EndsWith(".wrapcert-new"));
  EXPECT_EQ(steps[2], fs::path(index()).filename().string());
  EXPECT_EQ(steps[5], steps[2]);
}

TEST_P(ShardedInPlace, AFailureAtAnyStepLeavesACheckpointThatLoads) {
  for (size_t k = 0; k < 6; ++k) {
    SCOPED_TRACE("failing at step " + std::to_string(k));
    copy_golden();
    size_t step = 0;
    EXPECT_THROW(fix([&](const std::string&) {
                   if (step++ == k) throw Error(ErrorCode::kInvalidArgument, "", "disk full");
                 }),
                 Error);
    // Before the first index the old checkpoint, and no temporary shard; from it on the new one.
    expect_loads_as(folder(), original_, /*renamed=*/k >= 2);
    if (k < 2) {
      EXPECT_EQ(folder_bytes(folder()).size(), 3u) << "temporary shards left behind";
    }
  }
}

TEST_P(ShardedInPlace, AKillAtAnyStepLeavesACheckpointThatLoads) {
  for (size_t k = 0; k < 6; ++k) {
    SCOPED_TRACE("killed at step " + std::to_string(k));
    copy_golden();
    EXPECT_EXIT(
        {
          size_t step = 0;
          fix([&](const std::string&) {
            if (step++ == k) ::raise(SIGKILL);
          });
        },
        ::testing::KilledBySignal(SIGKILL), "");
    expect_loads_as(folder(), original_, /*renamed=*/k >= 2);
  }
}

TEST_P(ShardedInPlace, AFileSizeLimitHitOnTheWayLeavesTheOldCheckpoint) {
  const auto before = folder_bytes(folder());
  const auto fix_within_512_bytes = [this] {
    ::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing the run
    rlimit limit{};
    limit.rlim_cur = limit.rlim_max = 512;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      fix();
    } catch (const Error& e) {
      std::cerr << e.what();
      std::_Exit(3);
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(fix_within_512_bytes(), ::testing::ExitedWithCode(3), "cannot write");
  EXPECT_EQ(folder_bytes(folder()), before);  // every file as it was, no temporary left
}

INSTANTIATE_TEST_SUITE_P(PyTorch113, ShardedInPlace,
                         ::testing::Values("sharded_bin", "sharded_safetensors"));

TEST(CheckpointFile, RenamingKeepsTensorsAndRefusesACollision) {
  const auto c = read_checkpoint(golden("tied.pt"));
  const auto renamed = rename_keys(c, {{"head.weight", "lm_head.weight"}});
  EXPECT_EQ(renamed.state["lm_head.weight"].data_ptr(), c.state["head.weight"].data_ptr());
  EXPECT_EQ(renamed.shards[0].keys.back(), "lm_head.weight");
  EXPECT_THAT(
      [&] {
        rename_keys(c, {{"head.weight", "embed.weight"}});
      },
      ThrowsError(ErrorCode::kKeyCollision, "embed.weight", HasSubstr("both be renamed")));
}

TEST(CheckDestination, RefusesDevicesFifosFoldersLinksAndTheInputAndLeavesThemAlone) {
  test_support::TempDir dir;
  const auto input = dir / "model.pt";
  fs::copy_file(golden("tied.pt"), input);
  struct stat before {};
  ASSERT_EQ(::stat("/dev/null", &before), 0);
  EXPECT_THAT(
      [] { check_destination("/dev/null", {}, false); },
      ThrowsError(ErrorCode::kInvalidArgument, "/dev/null", HasSubstr("is a character device")));
  EXPECT_THAT(
      [] { write_file_atomically("/dev/null", "x"); },
      ThrowsError(ErrorCode::kInvalidArgument, "/dev/null", HasSubstr("a character device")));
  struct stat after {};
  ASSERT_EQ(::stat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_rdev, before.st_rdev);

  const auto fifo = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT([&] { check_destination(fifo, {}, false); },
              ThrowsError(ErrorCode::kInvalidArgument, fifo, HasSubstr("is a FIFO")));
  EXPECT_THAT([&] { write_checkpoint(fifo, read_checkpoint(input)); },
              ThrowsError(ErrorCode::kInvalidArgument, fifo, HasSubstr("a FIFO")));
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));

  fs::create_directory(dir / "folder.pt");
  EXPECT_THAT(
      [&] { check_destination(dir / "folder.pt", {}, false); },
      ThrowsError(ErrorCode::kInvalidArgument, dir / "folder.pt", HasSubstr("is a directory")));
  fs::create_symlink(input, dir / "link.pt");
  EXPECT_THAT(
      [&] { check_destination(dir / "link.pt", {}, false); },
      ThrowsError(ErrorCode::kInvalidArgument, dir / "link.pt", HasSubstr("symbolic link")));

  EXPECT_THAT(
      [&] { check_destination(input, {input}, false); },
      ThrowsError(ErrorCode::kInvalidArgument, input, HasSubstr("is the checkpoint being read")));
  fs::create_hard_link(input, dir / "same.pt");
  EXPECT_THAT([&] { check_destination(dir / "same.pt", {input}, false); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "same.pt", HasSubstr("being read")));
  EXPECT_NO_THROW(check_destination(input, {input}, /*in_place=*/true));

  EXPECT_THAT([] { check_destination("", {}, false); },
              ThrowsError(ErrorCode::kInvalidArgument, "", HasSubstr("an empty destination")));
  EXPECT_THAT([&] { check_destination(dir / "model.npz", {}, false); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "model.npz",
                          HasSubstr("no checkpoint extension")));
  EXPECT_THAT([&] { check_destination(dir / "none/model.pt", {}, false); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "none/model.pt",
                          HasSubstr("a folder that does not exist")));
  EXPECT_EQ(read_bytes(input), read_bytes(golden("tied.pt")));
}

}  // namespace
}  // namespace wrapcert
