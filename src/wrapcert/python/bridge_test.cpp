#include <wrapcert/error.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/paths.h>
#include <wrapcert/unwrap.h>

#include <nlohmann/json.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace wrapcert::bridge {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::HasSubstr;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void expect_seed_verdicts(const std::vector<props::Verdict>& verdicts) {
  ASSERT_EQ(verdicts.size(), 5u);
  for (const auto& v : verdicts) {
    if (v.property == "P1 keys (legacy unwrap)") {
      EXPECT_FALSE(v.passed) << "the old unwrap leaves _orig_module in the layers' keys";
      EXPECT_THAT(v.key, ::testing::HasSubstr("._orig_module."));
    } else {
      EXPECT_TRUE(v.passed) << v.property << ": " << v.reason << " at " << v.key;
    }
  }
}

// Recorded by tools/tpu_bridge/seed_unwrap.py --emulate with Debian's python3-torch 1.13: real
// PyTorch state dicts and printout, a stand-in for torch_xla's wrapper class.
TEST(Bridge, RecordedRunMatchesTheReplica) {
  expect_seed_verdicts(
      check_fsdp_v2_keys(read(test_support::golden_dir() + "/tpu_bridge_tiny-gemma_emulated.json"),
                         fixtures::tiny_gemma()));
}

TEST(Bridge, MalformedJsonNamesTheField) {
  EXPECT_THROW((void)check_fsdp_v2_keys("{not json", fixtures::tiny_gemma()), Error);
  EXPECT_THAT(
      [&] {
        (void)check_fsdp_v2_keys(R"({"original": [], "wrapped": [], "legacy": []})",
                                 fixtures::tiny_gemma());
      },
      ThrowsError(ErrorCode::kInvalidArgument, "recursive"));
  // Found by the tree-dump fuzzer: a number past double's range is nlohmann's out_of_range,
  // not a parse_error, and escaped as such.
  EXPECT_THROW((void)check_fsdp_v2_keys(R"({"original": [1e1032300]})", fixtures::tiny_gemma()),
               Error);
  EXPECT_THROW((void)load_tree_dump(R"({"root": 0, "nodes": [1e1032300]})"), Error);
  // Also found by it: a shape whose element count fits int64 but whose size in bytes does not.
  EXPECT_THAT(
      [&] {
        (void)load_tree_dump(R"({"root": 0, "nodes": [{"class": "Linear", "children": [],
        "buffers": [], "params": [["weight", [9223372036854775807], "float32", 0]]}]})");
      },
      ThrowsError(ErrorCode::kMalformedInput, "weight", HasSubstr("too large")));
  // And under UBSan: a float where an integer belongs was cast out of range by nlohmann.
  EXPECT_THROW((void)load_tree_dump(R"({"root": 0, "nodes": [{"class": "Linear", "children": [],
        "buffers": [], "params": [["weight", [9.2e19], "float32", 0]]}]})"),
               Error);
}

TEST(Bridge, LiveRunOnThisMachinesPyTorch) {
  const std::string probe = "'" + python() + "' -c 'import torch' > /dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    GTEST_SKIP() << python() << " cannot import torch (install Debian's python3-torch)";
  }
  const auto out = std::filesystem::temp_directory_path() /
                   ("wrapcert-bridge-" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(run_seed_script(test_support::bridge_script(), out.string(), /*emulate=*/true));
  expect_seed_verdicts(check_fsdp_v2_keys(read(out.string()), fixtures::tiny_gemma()));
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace wrapcert::bridge

namespace wrapcert::bridge {
namespace {

// Trees dumped from real PyTorch by tools/torch_tree_dump.py: torch's own DataParallel,
// DistributedDataParallel (gloo, world size 1) and checkpoint_wrapper around a small model with
// a tied head, and a user module with a child named `module`.
const std::vector<std::string> kTreeCases = {"data_parallel", "ddp", "checkpoint",
                                             "data_parallel_over_checkpoint", "user_module"};

std::string recorded_tree(const std::string& name) {
  return read(test_support::golden_dir() + "/torch_tree/dump_" + name + ".json");
}

class TreeDump : public ::testing::TestWithParam<std::string> {};

TEST_P(TreeDump, RecordedPyTorchTreePassesTheKeyProperties) {
  for (const auto& v : check_tree_dump(recorded_tree(GetParam()))) {
    EXPECT_TRUE(v.passed) << v.property << ": " << v.reason << " at " << v.key;
  }
}

TEST_P(TreeDump, LivePyTorchTreePassesTheKeyProperties) {
  const std::string probe = "'" + python() + "' -c 'import torch' > /dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    GTEST_SKIP() << python() << " cannot import torch (install Debian's python3-torch)";
  }
  const auto out = std::filesystem::temp_directory_path() /
                   ("wrapcert-tree-" + std::to_string(::getpid()) + "-" + GetParam() + ".json");
  const std::string command = "'" + python() + "' '" + test_support::tree_dump_script() + "' " +
                              GetParam() + " --out '" + out.string() + "' > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  for (const auto& v : check_tree_dump(read(out.string()))) {
    EXPECT_TRUE(v.passed) << v.property << ": " << v.reason << " at " << v.key;
  }
  std::filesystem::remove(out);
}

INSTANTIATE_TEST_SUITE_P(PyTorchWrappers, TreeDump, ::testing::ValuesIn(kTreeCases),
                         [](const auto& info) { return info.param; });

TEST(TreeDump, EveryOrderOfPyTorchWrappersUnwrapsToTheSameKeys) {  // P12
  const auto expected =
      keys(unwrap_reference(load_tree_dump(recorded_tree("checkpoint"))).state_dict());
  for (const char* name : {"data_parallel", "ddp", "data_parallel_over_checkpoint"}) {
    EXPECT_EQ(keys(unwrap_reference(load_tree_dump(recorded_tree(name))).state_dict()), expected)
        << name;
  }
}

TEST(TreeDump, DuckTypingUnwrapsTheUserModuleThatReferenceLeavesAlone) {  // P9's wrong subject
  const auto text = recorded_tree("user_module");
  const auto python_keys =
      nlohmann::json::parse(text)["wrapped_keys"].get<std::vector<std::string>>();
  EXPECT_EQ(keys(unwrap_reference(load_tree_dump(text)).state_dict()), python_keys);
  EXPECT_NE(keys(unwrap(BuiltinUnwrap::kDuckTyped, load_tree_dump(text)).state_dict()),
            python_keys);
}

TEST(TreeDump, AWrapperWithItsChildElsewhereNamesThePath) {
  const std::string dump = R"({"root": 0, "wrappers": {"DataParallel": "DataParallel"},
    "nodes": [{"class": "DataParallel", "children": [["inner", 1]], "params": [], "buffers": []},
              {"class": "Linear", "children": [], "params": [["weight", [2, 2], "float32", 0]],
               "buffers": []}]})";
  EXPECT_THAT([&] { (void)load_tree_dump(dump); },
              ThrowsError(ErrorCode::kWrapperState, _, HasSubstr("'module'")));
}

}  // namespace
}  // namespace wrapcert::bridge
