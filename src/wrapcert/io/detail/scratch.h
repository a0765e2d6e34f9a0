#pragma once
/// Scratch space of this process's own, never over anything that was there before: a folder
/// made new and removed with what it holds, and a file with no name at all.
///
///   detail::ScratchFolder folder("wrapcert-p17", /*in_memory=*/true);
///   save_safetensors(folder.path() + "/model.safetensors", state);
///   detail::UnnamedFile copy;   // read and written through copy.path()

#include <string>

namespace wrapcert::detail {

/// A folder made new (mkdtemp, `PREFIX-XXXXXX`) under `$TMPDIR` (or /tmp), or with `in_memory`
/// under /dev/shm where there is one (a synced write there costs no disk flush); removed with
/// what it holds when destroyed.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& prefix = "wrapcert-scratch", bool in_memory = false);
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// A file with no name in any folder (`O_TMPFILE` under `$TMPDIR`, or /tmp), so that nothing is
/// left behind however the process ends; written and read through `path()` ("/proc/self/fd/N")
/// while this object lives.
class UnnamedFile {
 public:
  UnnamedFile();
  ~UnnamedFile();
  UnnamedFile(const UnnamedFile&) = delete;
  UnnamedFile& operator=(const UnnamedFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace wrapcert::detail
