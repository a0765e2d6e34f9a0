// The reader of module trees dumped from Python (tools/torch_tree_dump.py), and the checks run
// on what it builds: arbitrary JSON must give a mirror and verdicts, or an Error.
#include "fuzz_support.h"

#include <wrapcert/python/bridge.h>

#include <torch/types.h>
#include <torch/utils.h>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wrapcert;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)bridge::check_tree_dump(text);
  } catch (const Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
