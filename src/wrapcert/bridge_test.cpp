#include <wrapcert/bridge.h>
#include <wrapcert/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace wrapcert::bridge {
namespace {

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
  expect_seed_verdicts(check_seed_keys(
      read(std::string(WRAPCERT_GOLDEN_DIR) + "/tpu_bridge_tiny-gemma_emulated.json"),
      fixtures::tiny_gemma()));
}

TEST(Bridge, MalformedJsonNamesTheField) {
  EXPECT_THROW((void)check_seed_keys("{not json", fixtures::tiny_gemma()), Error);
  try {
    (void)check_seed_keys(R"({"original": [], "wrapped": [], "legacy": []})",
                          fixtures::tiny_gemma());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.key_path(), "recursive");
  }
}

TEST(Bridge, LiveRunOnThisMachinesPyTorch) {
  const std::string probe = "'" + python() + "' -c 'import torch' > /dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    GTEST_SKIP() << python() << " cannot import torch (install Debian's python3-torch)";
  }
  const auto out = std::filesystem::temp_directory_path() /
                   ("wrapcert-bridge-" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(run_seed_script(WRAPCERT_BRIDGE_SCRIPT, out.string(), /*emulate=*/true));
  expect_seed_verdicts(check_seed_keys(read(out.string()), fixtures::tiny_gemma()));
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace wrapcert::bridge
