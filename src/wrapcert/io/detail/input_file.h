#pragma once
/// Opening a file wrapcert reads, refused by type before any byte is read: a FIFO, a device, a
/// socket or a directory named where a file is expected is an `Error` naming the path (opening
/// does not block, so a FIFO cannot hang the run).
///
///   detail::InputFile in("model.safetensors");
///   char head[8];
///   in.read_at(0, head, sizeof head);

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace wrapcert {
class Error;
}

namespace wrapcert::detail {

/// The error for a file that is not what it claims to be (kMalformedInput): the file's path and
/// what is wrong, and the key at fault where one is.
///
///   throw detail::malformed_file(path, "the header is not a JSON object");
Error malformed_file(const std::string& path, const std::string& what, const std::string& key = "");

/// "a FIFO", "a directory", "a character device", ... for `st_mode`.
std::string describe_file_type(mode_t mode);

class InputFile {
 public:
  /// Throws `Error` (kInvalidArgument) naming `path` when it is missing, unreadable or not a
  /// regular file.
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  /// Reads exactly `n` bytes at `offset`; throws `Error` (kMalformedInput) naming the path when
  /// the file ends first.
  void read_at(uint64_t offset, void* out, size_t n) const;
  /// The descriptor, now owned by the caller (libzip's `zip_fdopen` takes it).
  int release();

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// The whole file mapped read-only: pages are read only where they are touched, so a reader that
/// looks at a pickle at the start of a large file uses memory for the pickle alone.
class MappedFile {
 public:
  explicit MappedFile(const InputFile& file);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace wrapcert::detail
