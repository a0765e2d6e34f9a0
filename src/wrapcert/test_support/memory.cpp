#include <wrapcert/test_support/memory.h>

#include <fstream>
#include <string>

namespace wrapcert::test_support {

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

}  // namespace wrapcert::test_support
