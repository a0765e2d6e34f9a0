#include <wrapcert/error.h>
#include <wrapcert/safetensors.h>
#include <wrapcert/torch_save.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace wrapcert {
namespace {

// Files written by PyTorch itself (fixtures/golden/torch_save/make_files.py, Debian's
// python3-torch 1.13), with what they must read back as.
std::string file(const std::string& name) {
  return std::string(WRAPCERT_GOLDEN_DIR) + "/torch_save/" + name;
}

nlohmann::json expected() {
  std::ifstream in(file("expected.json"));
  return nlohmann::json::parse(in);
}

class TorchSave : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchSave, ReadsWhatPythonSavedKeysShapesDtypesValuesAndTies) {
  const auto state = load_torch_save(file(GetParam()));
  const auto want = expected();
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
    try {
      (void)load_torch_save(file(name));
      FAIL() << "read a damaged file: " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMalformedInput);
      EXPECT_THAT(e.what(), ::testing::HasSubstr(name));
    }
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
