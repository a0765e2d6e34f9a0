#include <wrapcert/error.h>
#include <wrapcert/io/detail/atomic_file.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kInvalidArgument, path,
              "cannot write '" + path + "': " + what + " (" + std::strerror(err) + ")");
}

/// The destination's folder, open for `linkat`, `fsync` and the unnamed file.
class Folder {
 public:
  explicit Folder(const std::string& path) {
    auto parent = fs::path(path).parent_path();
    name_ = parent.empty() ? "." : parent.string();
    fd_ = ::open(name_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) fail(path, "cannot open its folder", errno);
  }
  ~Folder() { ::close(fd_); }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  int fd() const { return fd_; }

 private:
  std::string name_;
  int fd_ = -1;
};

std::string temporary_name(const std::string& path) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const auto base = fs::path(path).filename().string();
  return "." + base + ".wrapcert-" + std::to_string(::getpid()) + "-" +
         std::to_string(rng() % 1000000007u);
}

/// Only a regular file may be replaced: a device, FIFO, socket, folder or symbolic link at the
/// destination stays as it is (as root, a rename would replace `/dev/null` itself).
void refuse_special(const Folder& folder, const std::string& path) {
  struct stat st {};
  const auto name = fs::path(path).filename().string();
  if (::fstatat(folder.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISLNK(st.st_mode)  ? "a symbolic link"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a special file";
    throw Error(ErrorCode::kInvalidArgument, path,
                "cannot write '" + path + "': it is " + what +
                    ", not a regular file; wrapcert writes only regular files and new paths");
  }
}

mode_t mode_for(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return st.st_mode & 07777;
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write) {
  if (path.empty() || fs::path(path).filename().empty()) {
    throw Error(ErrorCode::kInvalidArgument, path, "cannot write '" + path + "': not a file name");
  }
  const Folder folder(path);
  refuse_special(folder, path);
  // An unnamed file vanishes with the process if the run is killed before it is linked; where
  // the file system has no O_TMPFILE, a named temporary file stands in.
  std::string named;
  int fd = ::openat(folder.fd(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    named = temporary_name(path);
    fd = ::openat(folder.fd(), named.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) fail(path, "cannot create a temporary file beside it", errno);
  }
  auto discard = [&] {
    if (!named.empty()) ::unlinkat(folder.fd(), named.c_str(), 0);
  };
  try {
    {
      __gnu_cxx::stdio_filebuf<char> buffer(fd, std::ios::out | std::ios::binary);
      std::ostream out(&buffer);
      write(out);
      out.flush();
      if (!out) fail(path, "writing failed", errno ? errno : EIO);
      if (::fchmod(fd, mode_for(path)) != 0 || ::fsync(fd) != 0) fail(path, "cannot sync", errno);
      if (named.empty()) {
        // Give the unnamed file a temporary name; `rename` then replaces the destination.
        named = temporary_name(path);
        const auto self = "/proc/self/fd/" + std::to_string(fd);
        if (::linkat(AT_FDCWD, self.c_str(), folder.fd(), named.c_str(), AT_SYMLINK_FOLLOW) != 0 &&
            ::linkat(fd, "", folder.fd(), named.c_str(), AT_EMPTY_PATH) != 0) {
          const int err = errno;
          named.clear();
          fail(path, "cannot link the new file", err);
        }
      }
    }  // closes fd
    const auto target = fs::path(path).filename().string();
    refuse_special(folder, path);
    if (::renameat(folder.fd(), named.c_str(), folder.fd(), target.c_str()) != 0) {
      fail(path, "cannot move the new file into place", errno);
    }
    ::fsync(folder.fd());
  } catch (...) {
    discard();
    throw;
  }
}

void link_atomically(const std::string& source, const std::string& destination) {
  const Folder folder(destination);
  refuse_special(folder, destination);
  const auto named = temporary_name(destination);
  if (::linkat(AT_FDCWD, source.c_str(), folder.fd(), named.c_str(), 0) != 0) {
    fail(destination, "cannot link '" + source + "' beside it", errno);
  }
  const auto target = fs::path(destination).filename().string();
  try {
    refuse_special(folder, destination);
    if (::renameat(folder.fd(), named.c_str(), folder.fd(), target.c_str()) != 0) {
      fail(destination, "cannot move the new file into place", errno);
    }
  } catch (...) {
    ::unlinkat(folder.fd(), named.c_str(), 0);
    throw;
  }
  ::fsync(folder.fd());
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  write_file_atomically(path, [contents](std::ostream& out) {
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  });
}

}  // namespace wrapcert
