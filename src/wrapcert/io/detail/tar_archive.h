#pragma once
/// Tar archives, plain or gzipped, as Python's `tarfile` writes them (NeMo's `.nemo` files),
/// through libarchive: listed with every member's name checked, one member copied out, and the
/// whole archive copied with one member's data replaced and every other member kept as it was.
///
///   auto tar = detail::list_tar("model.nemo");
///   std::ofstream out(scratch / "model_weights.ckpt", std::ios::binary);
///   detail::extract_tar_member("model.nemo", "./model_weights.ckpt", out);

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace wrapcert::detail {

struct TarMember {
  std::string name;  ///< as stored ("./model_weights.ckpt")
  std::string path;  ///< without leading "./" ("model_weights.ckpt")
  uint64_t size = 0;
  bool regular = false;  ///< a regular file (not a folder, link or hard link)
  bool folder = false;
  int64_t header = 0;  ///< the header's byte in the (uncompressed) archive
};

struct TarListing {
  std::vector<TarMember> members;  ///< in stored order
  bool gzip = false;               ///< the archive is gzipped (tarfile's "w:gz")
};

/// True when the file's content is a tar archive ("ustar" at byte 257) or gzip data.
bool looks_like_tar(const std::string& path);

/// Every member of the archive at `path`. Throws `Error` (kMalformedInput) naming the file, and
/// the member and the byte of its header where there is one, for damage (a truncated archive, a
/// bad header or gzip stream), a member named twice, or a member (or link) that lies outside the
/// archive's folder (an absolute path or a `..` component).
TarListing list_tar(const std::string& path);

/// Writes the data of the member stored as `name` to `out`.
void extract_tar_member(const std::string& path, const std::string& name, std::ostream& out);

/// Writes the archive at `path` to `out`, in its own tar format and compression, with the data
/// of the member stored as `name` replaced by the file `replacement`'s; every other member
/// (headers, data, links, folders) is copied as it is.
void rewrite_tar_member(const std::string& path, const std::string& name,
                        const std::string& replacement, std::ostream& out);

}  // namespace wrapcert::detail
