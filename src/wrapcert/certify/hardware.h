#pragma once
/// What accelerators this host has: CPU always, CUDA through LibTorch, TPUs by what a TPU host
/// shows. The file-system root and the environment are injectable, so tests present fake hosts.
///
///   auto hw = wrapcert::hardware::detect();
///   if (!hw.cuda_devices) std::cout << hw.cuda_reason;   // "LibTorch reports no CUDA ..."
///   std::cout << wrapcert::hardware::to_json(hw);

#include <map>
#include <string>
#include <vector>

namespace wrapcert::hardware {

struct Report {
  bool cpu = true;
  int cuda_devices = 0;
  std::vector<std::string> cuda_names;
  std::string cuda_reason;  ///< why there is no CUDA run, when there is none
  /// NVIDIA PCI devices seen in sysfs, whether or not LibTorch can use them.
  int nvidia_pci_devices = 0;
  bool tpu = false;
  std::vector<std::string> tpu_evidence;  ///< what made us think so
  std::string tpu_reason;                 ///< why there is no TPU run, when there is none
};

struct ProbeOptions {
  std::string root = "/";  ///< where `sys/`, `dev/` and library folders are looked up
  /// The environment to read `TPU_*` from; empty means this process's.
  std::map<std::string, std::string> environment;
  bool use_environment = true;    ///< read this process's environment when the map is empty
  bool ask_libtorch_cuda = true;  ///< false: fake hosts, where LibTorch's answer is irrelevant
};

Report detect(const ProbeOptions& options = {});

std::string to_text(const Report& report);
std::string to_json(const Report& report);

/// This process's environment, by name.
std::map<std::string, std::string> process_environment();

}  // namespace wrapcert::hardware
