#include <wrapcert/error.h>
#include <wrapcert/io/detail/scratch.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace wrapcert::detail {
namespace {

namespace fs = std::filesystem;

fs::path temporary_folder() {
  const char* tmp = std::getenv("TMPDIR");
  return (tmp && *tmp) ? fs::path(tmp) : fs::path("/tmp");
}

}  // namespace

ScratchFolder::ScratchFolder(const std::string& prefix, bool in_memory) {
  std::error_code ec;
  const auto base = in_memory && fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                        ? fs::path("/dev/shm")
                        : temporary_folder();
  std::string pattern = (base / (prefix + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, base.string(),
                "cannot make a scratch folder in " + base.string() + ": " + std::strerror(errno));
  }
  path_ = pattern;
}

ScratchFolder::~ScratchFolder() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

UnnamedFile::UnnamedFile() {
  const auto folder = temporary_folder().string();
  fd_ = ::open(folder.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    // A file system without O_TMPFILE: a new name, removed at once.
    std::string pattern = folder + "/wrapcert-scratch-XXXXXX";
    fd_ = ::mkostemp(pattern.data(), O_CLOEXEC);
    if (fd_ >= 0) ::unlink(pattern.c_str());
  }
  if (fd_ < 0) {
    throw Error(ErrorCode::kInvalidArgument, folder,
                "cannot make a scratch file in " + folder + ": " + std::strerror(errno));
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

UnnamedFile::~UnnamedFile() {
  ::close(fd_);
}

}  // namespace wrapcert::detail
