#include <wrapcert/certify/hardware.h>

#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace wrapcert::hardware {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGoogleVendor = "0x1ae0";
constexpr const char* kNvidiaVendor = "0x10de";

std::string read_first_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// PCI devices whose vendor file says `vendor`, by device folder name.
std::vector<std::string> pci_devices(const fs::path& root, const std::string& vendor) {
  std::vector<std::string> found;
  std::error_code ec;
  const auto dir = root / "sys/bus/pci/devices";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (read_first_line(entry.path() / "vendor") == vendor) {
      found.push_back(entry.path().filename().string());
    }
  }
  return found;
}

std::vector<std::string> matching(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back((dir / name).string());
  }
  return found;
}

}  // namespace

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

Report detect(const ProbeOptions& options) {
  Report report;
  const fs::path root(options.root);

  report.nvidia_pci_devices = static_cast<int>(pci_devices(root, kNvidiaVendor).size());
  if (options.ask_libtorch_cuda && torch::cuda::is_available()) {
    report.cuda_devices = static_cast<int>(torch::cuda::device_count());
    for (int i = 0; i < report.cuda_devices; ++i) {
      report.cuda_names.push_back("cuda:" + std::to_string(i));
    }
  } else if (report.nvidia_pci_devices > 0) {
    report.cuda_reason = std::to_string(report.nvidia_pci_devices) +
                         " NVIDIA PCI device(s) present, but LibTorch reports no CUDA (a CPU-only "
                         "LibTorch build, or no driver)";
  } else {
    report.cuda_reason =
        "no CUDA device: LibTorch reports none and no NVIDIA PCI device is present";
  }

  for (const auto& dev : pci_devices(root, kGoogleVendor)) {
    report.tpu_evidence.push_back("Google PCI device " + dev);
  }
  for (const auto& dev : matching(root / "dev", "accel")) report.tpu_evidence.push_back(dev);
  for (const auto& dev : matching(root / "dev/vfio", "")) report.tpu_evidence.push_back(dev);
  auto env = options.environment;
  if (env.empty() && options.use_environment) env = process_environment();
  for (const auto& [key, value] : env) {
    if (key.rfind("TPU_", 0) == 0) report.tpu_evidence.push_back("environment " + key);
  }
  for (const char* lib : {"usr/lib/libtpu.so", "usr/local/lib/libtpu.so", "lib/libtpu.so"}) {
    std::error_code ec;
    if (fs::exists(root / lib, ec)) report.tpu_evidence.push_back((root / lib).string());
  }
  // A Google accelerator on the PCI bus, or an accel device with TPU settings, is a TPU host;
  // /dev/vfio or a TPU_ variable alone are not enough.
  const bool google_pci = !pci_devices(root, kGoogleVendor).empty();
  const bool accel = !matching(root / "dev", "accel").empty();
  report.tpu = google_pci || (accel && report.tpu_evidence.size() > 1);
  if (!report.tpu) {
    report.tpu_reason = report.tpu_evidence.empty()
                            ? "no TPU: no Google PCI device, /dev/accel*, TPU_* variable or libtpu"
                            : "no TPU: only weak signs (" + report.tpu_evidence.front() + ")";
  }
  return report;
}

std::string to_text(const Report& r) {
  std::ostringstream out;
  out << "cpu: yes\n";
  out << "cuda: " << r.cuda_devices << " device(s)";
  for (const auto& n : r.cuda_names) out << " " << n;
  if (!r.cuda_reason.empty()) out << " (" << r.cuda_reason << ")";
  out << "\ntpu: " << (r.tpu ? "yes" : "no");
  if (!r.tpu_reason.empty()) out << " (" << r.tpu_reason << ")";
  for (const auto& e : r.tpu_evidence) out << "\n  evidence: " << e;
  return out.str() + "\n";
}

std::string to_json(const Report& r) {
  nlohmann::json j = {
      {"cpu", r.cpu},
      {"cuda",
       {{"devices", r.cuda_devices},
        {"names", r.cuda_names},
        {"reason", r.cuda_reason},
        {"nvidia_pci_devices", r.nvidia_pci_devices}}},
      {"tpu", {{"present", r.tpu}, {"evidence", r.tpu_evidence}, {"reason", r.tpu_reason}}},
  };
  return j.dump(2) + "\n";
}

}  // namespace wrapcert::hardware
