#pragma once
/// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON header
/// (dtype, shape, data offsets per tensor), then the data.
///
///   auto header = wrapcert::read_safetensors_header("model.safetensors");  // validated
///   auto state = wrapcert::load_safetensors("model.safetensors");
///   wrapcert::save_safetensors("clean.safetensors", wrapcert::unwrap_reference(m).state_dict());
///
/// Damage is an `Error` (kMalformedInput) naming the file and, where there is one, the key.

#include <wrapcert/view.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert {

struct SafetensorsEntry {
  std::string key;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< offsets into the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  ///< in the header's order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  ///< where the data section starts in the file
  uint64_t file_size = 0;
};

/// Reads and validates the header: a regular file (a FIFO, device or directory is refused before
/// any read), length within the file and the 100,000,000-byte limit of the safetensors library,
/// JSON that parses and names no key twice, known dtypes, non-negative shapes, offsets matching
/// each tensor's size, and tensors that tile the data section: no overlap, no gap, no bytes after
/// the last one.
SafetensorsHeader read_safetensors_header(const std::string& path);

/// Every key the file was saved with, in order, paired with the key its data is stored under
/// (itself, or the tensor it is an alias of). Without wrapcert's metadata: the stored keys in
/// header order. Throws `Error` (kMalformedInput) for damaged alias metadata, or metadata that
/// leaves a stored tensor without a key.
std::vector<std::pair<std::string, std::string>> saved_keys(const SafetensorsHeader& header,
                                                            const std::string& path = "");

/// Every tensor, on the CPU. Keys saved as aliases of another (tied weights written once) come
/// back as the same tensor, in the order they were saved.
StateDict load_safetensors(const std::string& path);
/// As `load_safetensors`, with every tensor on the meta device: reads the header alone.
StateDict list_safetensors(const std::string& path);

/// Writes `state` the way Hugging Face does: a tensor shared by several keys (a tied weight: one
/// storage at the same offset with the same shape, strides and dtype, as `torch.save` keeps it)
/// is stored once, under its first key, and the others are left out, as Transformers saves a
/// tied head, and listed in `__metadata__` (`wrapcert.aliases`: key -> [stored key, place in
/// the saved order]) so `load_safetensors` gives them back as one tensor; with
/// `SafetensorsTies::kCopy` each is stored as a copy. Keys are written in saved order; other
/// views are stored as contiguous copies of their values. A header over the 100,000,000 bytes
/// the safetensors library accepts is refused (kUnsupported) before anything is written.
/// Written through a temporary file and a rename, so a reader never sees half a file.
enum class SafetensorsTies {
  kStoreOnce,  ///< a tied key stored once, the others listed (Transformers leaves them out)
  kCopy,       ///< every key stored, tied ones as copies: any reader gives every key back
};

void save_safetensors(const std::string& path, const StateDict& state,
                      const std::map<std::string, std::string>& metadata = {},
                      SafetensorsTies ties = SafetensorsTies::kStoreOnce);

}  // namespace wrapcert
