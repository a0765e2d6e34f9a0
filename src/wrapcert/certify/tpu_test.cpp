// The seed's real case: torch_xla's SpmdFullyShardedDataParallel on a TPU host, driven through
// the bridge script, checked against the C++ replica (label `tpu`; skipped with the reason
// elsewhere).

#include <wrapcert/certify/hardware_gtest.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/test_support/paths.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace wrapcert::bridge {
namespace {

TEST(Tpu, RealSpmdFsdpKeysMatchTheReplica) {
  WRAPCERT_REQUIRE_TPU();
  const auto out = std::filesystem::temp_directory_path() / "wrapcert-tpu-bridge.json";
  ASSERT_TRUE(run_seed_script(test_support::bridge_script(), out.string(), /*emulate=*/false))
      << "the bridge script failed: is torch_xla installed for " << python() << "?";
  std::ifstream in(out);
  std::ostringstream text;
  text << in.rdbuf();
  for (const auto& v : check_fsdp_v2_keys(text.str(), fixtures::tiny_gemma())) {
    if (v.property == "P1 keys (legacy unwrap)") {
      EXPECT_FALSE(v.passed);
    } else {
      EXPECT_TRUE(v.passed) << v.property << ": " << v.reason;
    }
  }
}

}  // namespace
}  // namespace wrapcert::bridge
