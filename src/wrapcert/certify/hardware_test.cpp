#include <wrapcert/certify/hardware.h>
#include <wrapcert/test_support/temp_dir.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace wrapcert::hardware {
namespace {

namespace fs = std::filesystem;

/// A fake host under a temporary root.
class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directories(root_ / "dev");
  }

  void pci(const std::string& slot, const std::string& vendor) {
    fs::create_directories(root_ / "sys/bus/pci/devices" / slot);
    std::ofstream(root_ / "sys/bus/pci/devices" / slot / "vendor") << vendor << "\n";
  }
  void touch(const std::string& path) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << "";
  }
  Report probe(std::map<std::string, std::string> env = {{"HOME", "/root"}}) {
    ProbeOptions o;
    o.root = root_.string();
    o.environment = std::move(env);
    o.ask_libtorch_cuda = false;
    return detect(o);
  }

  test_support::TempDir host_;
  const fs::path root_ = host_.path();
};

TEST_F(FakeHost, TpuHostIsDetectedWithItsEvidence) {
  pci("0000:00:04.0", "0x1ae0");  // Google
  pci("0000:00:01.0", "0x8086");
  touch("dev/accel0");
  touch("usr/lib/libtpu.so");
  const auto r = probe({{"TPU_NAME", "v4-8"}, {"HOME", "/root"}});
  EXPECT_TRUE(r.tpu);
  EXPECT_TRUE(r.tpu_reason.empty());
  EXPECT_THAT(r.tpu_evidence, ::testing::Contains(::testing::HasSubstr("Google PCI device")));
  EXPECT_THAT(r.tpu_evidence, ::testing::Contains("environment TPU_NAME"));
  EXPECT_EQ(r.nvidia_pci_devices, 0);
}

TEST_F(FakeHost, GpuHostShowsNvidiaButNoTpu) {
  pci("0000:17:00.0", "0x10de");
  pci("0000:65:00.0", "0x10de");
  const auto r = probe();
  EXPECT_FALSE(r.tpu);
  EXPECT_EQ(r.nvidia_pci_devices, 2);
  EXPECT_EQ(r.cuda_devices, 0);
  EXPECT_THAT(r.cuda_reason, ::testing::HasSubstr("2 NVIDIA PCI device(s) present"));
}

TEST_F(FakeHost, BareHostHasOnlyTheCpu) {
  const auto r = probe();
  EXPECT_TRUE(r.cpu);
  EXPECT_FALSE(r.tpu);
  EXPECT_TRUE(r.tpu_evidence.empty());
  EXPECT_THAT(r.tpu_reason, ::testing::HasSubstr("no Google PCI device"));
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_EQ(j["tpu"]["present"], false);
  EXPECT_EQ(j["cuda"]["devices"], 0);
  EXPECT_THAT(to_text(r), ::testing::HasSubstr("tpu: no"));
}

TEST_F(FakeHost, WeakSignsAloneAreNotATpu) {
  touch("dev/vfio/vfio");
  const auto r = probe({{"TPU_ACCELERATOR_TYPE", "v4-8"}});
  EXPECT_FALSE(r.tpu);
  EXPECT_EQ(r.tpu_evidence.size(), 2u);
  EXPECT_THAT(r.tpu_reason, ::testing::HasSubstr("only weak signs"));
}

}  // namespace
}  // namespace wrapcert::hardware
