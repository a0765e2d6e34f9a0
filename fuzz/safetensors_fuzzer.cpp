// The safetensors reader on arbitrary files: the header validation, the alias metadata and the
// tensor data read back. A file that validates must load with every tensor holding the bytes
// its header promised.
#include "fuzz_support.h"

#include <wrapcert/io/safetensors.h>

#include <torch/types.h>
#include <torch/utils.h>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wrapcert;
  const fuzz::MemoryFile file(data, size);
  try {
    const auto header = read_safetensors_header(file.path());
    if (header.file_size != size || header.data_offset > size) fuzz::violated("header bounds");
    const auto state = load_safetensors(file.path());
    const auto saved = saved_keys(header, file.path());
    if (state.size() != saved.size()) fuzz::violated("loaded a different number of keys");
    for (const auto& e : header.tensors) {
      const auto* t = state.find(e.key);
      if (!t) continue;  // a stored tensor may be listed only under aliases' order
      const auto bytes = static_cast<uint64_t>(t->numel()) * t->element_size();
      if (bytes != e.end - e.begin || t->scalar_type() != e.dtype) fuzz::violated(e.key);
      if (bytes && std::memcmp(t->data_ptr(), data + header.data_offset + e.begin, bytes) != 0) {
        fuzz::violated("the data of " + e.key + " differs from the file");
      }
    }
  } catch (const Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
