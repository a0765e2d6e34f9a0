#include <wrapcert/error.h>
#include <wrapcert/io/detail/input_file.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace wrapcert::detail {

Error malformed_file(const std::string& path, const std::string& what, const std::string& key) {
  return Error(ErrorCode::kMalformedInput, key, path + ": " + what);
}

std::string describe_file_type(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw Error(ErrorCode::kInvalidArgument, "", "an empty file name");
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer; the type check follows.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) {
    throw Error(ErrorCode::kInvalidArgument, path_,
                std::string("cannot open it: ") + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    const std::string what =
        S_ISREG(st.st_mode) ? std::strerror(err) : describe_file_type(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    throw Error(ErrorCode::kInvalidArgument, path_, "it is " + what + ", not a checkpoint file");
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* out, size_t n) const {
  auto* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const auto got = ::pread(fd_, bytes + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      throw malformed_file(path_, std::string("cannot read (") + std::strerror(errno) + ")");
    }
    if (got == 0) throw malformed_file(path_, "the file ends early");
    done += static_cast<size_t>(got);
  }
}

int InputFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

MappedFile::MappedFile(const InputFile& file) : size_(file.size()) {
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED) {
    throw malformed_file(file.path(),
                         std::string("cannot map the file (") + std::strerror(errno) + ")");
  }
  data_ = static_cast<const char*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace wrapcert::detail
