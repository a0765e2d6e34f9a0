#include <wrapcert/error.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/temp_dir.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;
using test_support::ThrowsError;
using ::testing::HasSubstr;

class Safetensors : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// A file with `header` as its JSON and `data` bytes of data, as another writer would make.
  std::string raw(const std::string& header, size_t data, uint64_t length_override = 0) {
    auto p = path("raw.safetensors");
    std::ofstream out(p, std::ios::binary);
    const uint64_t length = length_override ? length_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
    out << header << std::string(data, '\0');
    return p;
  }
  void expect_damaged(const std::string& file, const std::string& key, const std::string& what) {
    EXPECT_THAT([&] { (void)read_safetensors_header(file); },
                ThrowsError(ErrorCode::kMalformedInput, key, HasSubstr(what)));
  }

  test_support::TempDir tmp_;
  const fs::path dir_ = tmp_.path();
};

TEST_F(Safetensors, RoundTripsAnUnwrappedModelStoringATiedWeightOnce) {
  const auto config = fixtures::tiny_gemma();
  auto wrapped = fixtures::apply_fsdp_v2_recipe(fixtures::make_causal_lm(config), config);
  const auto state = unwrap_reference(wrapped).state_dict();
  save_safetensors(path("model.safetensors"), state, {{"format", "pt"}});

  const auto header = read_safetensors_header(path("model.safetensors"));
  EXPECT_EQ(header.tensors.size(), state.size() - 1) << "lm_head.weight is stored once";
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.data_offset % 8, 0u);

  const auto loaded = load_safetensors(path("model.safetensors"));
  EXPECT_EQ(keys(loaded), keys(state));
  for (const auto& item : state) EXPECT_TRUE(loaded[item.key()].equal(item.value())) << item.key();
  EXPECT_TRUE(loaded["lm_head.weight"].is_same(loaded["model.embed_tokens.weight"]));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1)
      << "no temporary file is left beside the checkpoint";
}

TEST_F(Safetensors, ReadsAFileWithoutWrapcertMetadataInHeaderOrder) {
  const auto file = raw(
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})",
      16);
  const auto loaded = load_safetensors(file);
  EXPECT_THAT(keys(loaded), ::testing::ElementsAre("b", "a"));
  EXPECT_EQ(loaded["a"].scalar_type(), torch::kLong);
}

TEST_F(Safetensors, RejectsEachKindOfDamageNamingTheKey) {
  {
    const auto p = path("short.safetensors");
    std::ofstream(p) << "abc";
    expect_damaged(p, "", "shorter than the 8-byte header length");
  }
  expect_damaged(raw("{}", 0, 1000), "", "exceeds the file");
  expect_damaged(raw("{not json", 0), "", "not JSON");
  expect_damaged(raw(R"({"w":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1), "w",
                 "unknown dtype 'F8'");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "w",
                 "non-negative integer");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "w",
                 "outside the 8-byte data section");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "w",
                 "need 12");
  expect_damaged(
      raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "b", "overlaps 'a'");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[1]}})", 4), "w", "needs dtype, shape");
}

TEST_F(Safetensors, RejectsWhatTheSafetensorsLibraryRejects) {
  expect_damaged(
      raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8),
      "w", "names 'w' twice");
  expect_damaged(
      raw(R"({"__metadata__":{"format":"pt","format":"np"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          4),
      "__metadata__.format", "twice");
  expect_damaged(raw("{}", 0, uint64_t{200} * 1024 * 1024), "",
                 "header length 209715200 exceeds the limit of 100000000 bytes");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6), "",
                 "2 bytes follow the last tensor's data");
  expect_damaged(raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "w",
                 "4 bytes before its data belong to no tensor");
}

TEST_F(Safetensors, MetadataCannotHideAStoredTensor) {
  const auto file = raw(
      R"({"__metadata__":{"wrapcert.order":"[]"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      4);
  EXPECT_THAT(
      [&] { (void)load_safetensors(file); },
      ThrowsError(ErrorCode::kMalformedInput, "w", HasSubstr("missing from wrapcert.order")));
}

TEST_F(Safetensors, ATieIsOneStorageAtOneOffsetEvenAcrossTensorObjects) {
  const auto storage = torch::arange(6, torch::kFloat);
  StateDict state;  // as PyTorch's state_dict() gives a tied weight: two tensor objects
  state.insert("embed.weight", storage.view({2, 3}));
  state.insert("head.weight", storage.view({2, 3}));
  state.insert("half", storage.narrow(0, 3, 3));  // same storage, another offset
  save_safetensors(path("tied.safetensors"), state);
  EXPECT_EQ(read_safetensors_header(path("tied.safetensors")).tensors.size(), 2u);
  const auto loaded = load_safetensors(path("tied.safetensors"));
  EXPECT_TRUE(loaded["head.weight"].is_same(loaded["embed.weight"]));
  EXPECT_TRUE(loaded["half"].equal(storage.narrow(0, 3, 3)));
}

TEST_F(Safetensors, KeepsTheSavedOrderWithEveryKeyWrittenOnce) {
  const auto storage = torch::arange(6, torch::kFloat);
  StateDict state;
  state.insert("z.embed", storage.view({2, 3}));
  state.insert("b.head", storage.view({2, 3}));  // tied, in the middle of the order
  state.insert("a.norm", torch::ones({3}));
  save_safetensors(path("m.safetensors"), state, {{"format", "pt"}, {"step", "12"}});
  const auto header = read_safetensors_header(path("m.safetensors"));
  EXPECT_EQ(header.metadata.count("wrapcert.order"), 0u) << "no second copy of every key";
  EXPECT_EQ(header.metadata.at("wrapcert.aliases"), R"({"b.head":["z.embed",1]})");
  EXPECT_EQ(header.metadata.at("step"), "12");
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors[0].key, "z.embed");  // saved order, not sorted
  EXPECT_EQ(keys(load_safetensors(path("m.safetensors"))),
            std::vector<std::string>({"z.embed", "b.head", "a.norm"}));
}

TEST_F(Safetensors, TiesStoredAsCopiesAreEveryKeyForAnyReader) {
  const auto storage = torch::arange(6, torch::kFloat);
  StateDict state;
  state.insert("embed", storage.view({2, 3}));
  state.insert("head", storage.view({2, 3}));
  save_safetensors(path("c.safetensors"), state, {}, SafetensorsTies::kCopy);
  const auto header = read_safetensors_header(path("c.safetensors"));
  EXPECT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.metadata.count("wrapcert.aliases"), 0u);
  const auto loaded = load_safetensors(path("c.safetensors"));
  EXPECT_TRUE(loaded["head"].equal(loaded["embed"]));
  EXPECT_FALSE(loaded["head"].is_same(loaded["embed"]));
}

TEST_F(Safetensors, AHeaderOverTheLibrarysLimitIsRefusedBeforeAnythingIsWritten) {
  StateDict state;  // 48,000 keys of 2,100 characters: a header of about 105 MB
  const std::string stem(2100, 'k');
  const auto empty = torch::empty({0});
  for (int i = 0; i < 48000; ++i) state.insert(stem + std::to_string(i), empty.clone());
  EXPECT_THAT([&] { save_safetensors(path("big.safetensors"), state); },
              ThrowsError(ErrorCode::kUnsupported, "", HasSubstr("over the 100000000")));
  EXPECT_FALSE(fs::exists(path("big.safetensors")));
}

TEST_F(Safetensors, DamagedAliasesAreNamed) {
  const std::string w = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  auto file = raw(R"({"__metadata__":{"wrapcert.aliases":"{\"h\":[\"x\",0]}"},)" + w + "}", 4);
  EXPECT_THAT([&] { (void)load_safetensors(file); },
              ThrowsError(ErrorCode::kMalformedInput, "h", HasSubstr("lacks")));
  file = raw(R"({"__metadata__":{"wrapcert.aliases":"{\"h\":[\"w\",5]}"},)" + w + "}", 4);
  EXPECT_THAT([&] { (void)load_safetensors(file); },
              ThrowsError(ErrorCode::kMalformedInput, "h", HasSubstr("past the last key")));
}

}  // namespace
}  // namespace wrapcert
