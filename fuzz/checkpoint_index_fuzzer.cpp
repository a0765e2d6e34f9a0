// The shard index reader (the `weight_map` of model.safetensors.index.json and
// pytorch_model.bin.index.json) on arbitrary text: damage is a wrapcert::Error naming where,
// and every shard it accepts is a plain file name in the index's folder.
#include "fuzz_support.h"

#include <wrapcert/io/checkpoint_file.h>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& [key, file] : wrapcert::detail::parse_shard_index(text, "<fuzz>")) {
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\0') != std::string::npos) {
        wrapcert::fuzz::violated("shard '" + file + "' of '" + key + "' leaves the folder");
      }
    }
  } catch (const wrapcert::Error& e) {
    wrapcert::fuzz::check_error(e);
  }
  return 0;
}
