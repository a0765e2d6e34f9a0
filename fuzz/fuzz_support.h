#pragma once
// Shared by the fuzz targets: the contract each one checks is that bad input ends in a
// wrapcert::Error (which names what was wrong) and nothing else: no crash, no sanitizer report,
// no other exception type, no hang.

#include <wrapcert/error.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace wrapcert::fuzz {

/// The input as a file with a path, in memory (no disk writes per input).
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("wrapcert-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const auto n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

/// An invariant the target checks beyond "no crash": report and abort so libFuzzer keeps it.
[[noreturn]] inline void violated(const std::string& what) {
  std::cerr << "wrapcert fuzz invariant violated: " << what << "\n";
  std::abort();
}

/// Errors must say where: every message carries the "at '<path>'" part.
inline void check_error(const Error& e) {
  if (std::string(e.what()).find(" at '") == std::string::npos) violated(e.what());
}

}  // namespace wrapcert::fuzz
