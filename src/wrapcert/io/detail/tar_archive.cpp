#include <wrapcert/error.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/tar_archive.h>

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <set>

namespace wrapcert::detail {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlock = size_t{1} << 16;

using ReadArchive = std::unique_ptr<archive, decltype(&archive_read_free)>;
using WriteArchive = std::unique_ptr<archive, decltype(&archive_write_free)>;

std::string why(archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "an error libarchive does not describe";
}

/// Opens `file` (already refused by type when not a regular file) for reading as a tar archive,
/// plain or gzipped.
ReadArchive open_for_reading(const InputFile& file) {
  ReadArchive r(archive_read_new(), &archive_read_free);
  archive_read_support_filter_gzip(r.get());
  archive_read_support_format_tar(r.get());
  if (archive_read_open_fd(r.get(), file.fd(), kBlock) != ARCHIVE_OK) {
    throw malformed_file(file.path(),
                         "a damaged tar archive, met before its first member: " + why(r.get()));
  }
  return r;
}

/// The next member's header, or nullptr at the end; damage names the byte it was met at.
archive_entry* next_header(const ReadArchive& r, const std::string& path) {
  archive_entry* entry = nullptr;
  const int rc = archive_read_next_header(r.get(), &entry);
  if (rc == ARCHIVE_EOF) return nullptr;
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
    throw malformed_file(path, "a damaged tar archive at byte " +
                                   std::to_string(archive_read_header_position(r.get())) +
                                   " of its tar stream: " + why(r.get()));
  }
  return entry;
}

std::string without_dot_slash(std::string name) {
  while (name.size() >= 2 && name.compare(0, 2, "./") == 0) name.erase(0, 2);
  return name;
}

/// True when `name` would be extracted outside the archive's folder.
bool leaves_folder(const std::string& name) {
  if (name.empty() || name.front() == '/') return !name.empty();
  for (const auto& part : fs::path(name)) {
    if (part == "..") return true;
  }
  return false;
}

/// For a symbolic link stored as `name` pointing at `target`: true when the target lies
/// outside the archive's folder.
bool link_leaves_folder(const std::string& name, const std::string& target) {
  if (!target.empty() && target.front() == '/') return true;
  int depth = 0;
  for (const auto& part : fs::path(name).parent_path()) {
    if (part != "." && !part.empty()) ++depth;
  }
  for (const auto& part : fs::path(target)) {
    if (part == "..") {
      if (--depth < 0) return true;
    } else if (part != "." && !part.empty()) {
      ++depth;
    }
  }
  return false;
}

la_ssize_t write_to_stream(archive*, void* client, const void* buffer, size_t length) {
  auto* out = static_cast<std::ostream*>(client);
  out->write(static_cast<const char*>(buffer), static_cast<std::streamsize>(length));
  return *out ? static_cast<la_ssize_t>(length) : -1;
}

/// Hands the current member's data to `sink`, a block at a time.
template <typename Sink>
void each_block(const ReadArchive& r, const std::string& path, const std::string& name,
                Sink&& sink) {
  std::unique_ptr<char[]> buffer(new char[kBlock]);
  for (;;) {
    const la_ssize_t n = archive_read_data(r.get(), buffer.get(), kBlock);
    if (n == 0) return;
    if (n < 0) throw malformed_file(path, "the member '" + name + "' is damaged: " + why(r.get()));
    sink(buffer.get(), static_cast<size_t>(n));
  }
}

bool gzipped(const ReadArchive& r) {
  for (int i = 0; i < archive_filter_count(r.get()); ++i) {
    if (archive_filter_code(r.get(), i) == ARCHIVE_FILTER_GZIP) return true;
  }
  return false;
}

void write_data(const WriteArchive& w, const std::string& path, const char* data, size_t n) {
  if (archive_write_data(w.get(), data, n) != static_cast<la_ssize_t>(n)) {
    throw Error(ErrorCode::kInvalidArgument, path, "cannot write the archive: " + why(w.get()));
  }
}

}  // namespace

bool looks_like_tar(const std::string& path) {
  const InputFile file(path);
  unsigned char head[2] = {};
  if (file.size() >= 2) {
    file.read_at(0, head, 2);
    if (head[0] == 0x1f && head[1] == 0x8b) return true;
  }
  char magic[5] = {};
  if (file.size() < 262) return false;
  file.read_at(257, magic, 5);
  return std::memcmp(magic, "ustar", 5) == 0;
}

TarListing list_tar(const std::string& path) {
  const InputFile file(path);
  const auto r = open_for_reading(file);
  TarListing out;
  std::set<std::string> seen;
  while (archive_entry* entry = next_header(r, path)) {
    TarMember m;
    const char* name = archive_entry_pathname(entry);
    m.name = name ? name : "";
    m.path = without_dot_slash(m.name);
    m.header = archive_read_header_position(r.get());
    m.size = static_cast<uint64_t>(std::max<la_int64_t>(0, archive_entry_size(entry)));
    m.regular = archive_entry_filetype(entry) == AE_IFREG && !archive_entry_hardlink(entry);
    m.folder = archive_entry_filetype(entry) == AE_IFDIR;
    const std::string at = " (the header at byte " + std::to_string(m.header) + ")";
    if (leaves_folder(m.name)) {
      throw malformed_file(path, "the member '" + m.name + "'" + at +
                                     " lies outside the archive's folder; nothing extracted");
    }
    if (const char* target = archive_entry_symlink(entry);
        target && link_leaves_folder(m.path, target)) {
      throw malformed_file(path, "the link '" + m.name + "' -> '" + target + "'" + at +
                                     " leads outside the archive's folder");
    }
    if (const char* target = archive_entry_hardlink(entry); target && leaves_folder(target)) {
      throw malformed_file(path, "the hard link '" + m.name + "' -> '" + target + "'" + at +
                                     " leads outside the archive's folder");
    }
    if (!m.path.empty() && m.path.back() != '/' && !seen.insert(m.path).second) {
      throw malformed_file(path, "the member '" + m.name + "'" + at +
                                     " is stored twice; which one counts is not defined");
    }
    // Reading on checks the member's data (a truncated archive ends inside it).
    if (archive_read_data_skip(r.get()) != ARCHIVE_OK) {
      throw malformed_file(path,
                           "the member '" + m.name + "'" + at + " is damaged: " + why(r.get()));
    }
    out.members.push_back(std::move(m));
  }
  out.gzip = gzipped(r);
  if (out.members.empty()) throw malformed_file(path, "a tar archive with no member");
  return out;
}

void extract_tar_member(const std::string& path, const std::string& name, std::ostream& out) {
  const InputFile file(path);
  const auto r = open_for_reading(file);
  while (archive_entry* entry = next_header(r, path)) {
    const char* stored = archive_entry_pathname(entry);
    if (!stored || name != stored) continue;
    each_block(r, path, name, [&](const char* data, size_t n) {
      out.write(data, static_cast<std::streamsize>(n));
      if (!out) throw Error(ErrorCode::kInvalidArgument, path, "cannot copy '" + name + "' out");
    });
    return;
  }
  throw malformed_file(path, "no member '" + name + "'");
}

void rewrite_tar_member(const std::string& path, const std::string& name,
                        const std::string& replacement, std::ostream& out) {
  const InputFile file(path);
  const auto r = open_for_reading(file);
  WriteArchive w(archive_write_new(), &archive_write_free);
  bool opened = false;
  bool replaced = false;
  while (archive_entry* entry = next_header(r, path)) {
    if (!opened) {
      // The reader knows the format once it has read a header: GNU tar stays GNU tar, and
      // ustar or pax (what tarfile writes) is written as restricted pax, plain ustar headers
      // with extensions only where a name or size needs one.
      if (archive_format(r.get()) == ARCHIVE_FORMAT_TAR_GNUTAR) {
        archive_write_set_format_gnutar(w.get());
      } else {
        archive_write_set_format_pax_restricted(w.get());
      }
      if (gzipped(r)) archive_write_add_filter_gzip(w.get());
      if (archive_write_open(w.get(), &out, nullptr, write_to_stream, nullptr) != ARCHIVE_OK) {
        throw Error(ErrorCode::kInvalidArgument, path, "cannot write the archive: " + why(w.get()));
      }
      opened = true;
    }
    const char* stored = archive_entry_pathname(entry);
    const std::string member = stored ? stored : "";
    const bool swap = member == name;
    std::ifstream in;
    if (swap) {
      in.open(replacement, std::ios::binary);
      struct stat st {};
      if (!in || ::stat(replacement.c_str(), &st) != 0) {
        throw Error(ErrorCode::kInvalidArgument, replacement, "cannot read " + replacement);
      }
      archive_entry_set_size(entry, st.st_size);
      replaced = true;
    }
    if (archive_write_header(w.get(), entry) < ARCHIVE_WARN) {
      throw Error(ErrorCode::kInvalidArgument, path,
                  "cannot write the member '" + member + "': " + why(w.get()));
    }
    if (swap) {
      std::unique_ptr<char[]> buffer(new char[kBlock]);
      while (in) {
        in.read(buffer.get(), kBlock);
        write_data(w, path, buffer.get(), static_cast<size_t>(in.gcount()));
      }
    } else {
      each_block(r, path, member,
                 [&](const char* data, size_t n) { write_data(w, path, data, n); });
    }
  }
  if (!replaced) throw malformed_file(path, "no member '" + name + "'");
  if (archive_write_close(w.get()) != ARCHIVE_OK) {
    throw Error(ErrorCode::kInvalidArgument, path, "cannot write the archive: " + why(w.get()));
  }
}

}  // namespace wrapcert::detail
