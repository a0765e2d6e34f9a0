// The pickle machine that reads `torch.save`d state dicts, on arbitrary pickles. An input is
// the pickle, optionally followed by "\0RECORDS\0" and the archive's records as "name size"
// lines (fuzz/make_corpus.py writes the seeds so); each record holds `size` bytes of 0x5a.
#include "fuzz_support.h"

#include <wrapcert/detail/pickle.h>

#include <c10/core/CPUAllocator.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string_view>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wrapcert;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  static constexpr std::string_view kMarker{"\0RECORDS\0", 9};
  const auto marker = input.rfind(kMarker);
  const auto pickle = input.substr(0, marker);
  std::map<std::string, size_t> sizes;
  if (marker != std::string_view::npos) {
    std::istringstream table(std::string(input.substr(marker + kMarker.size())));
    std::string name;
    size_t bytes = 0;
    while (table >> name >> bytes) sizes[name] = std::min<size_t>(bytes, 1 << 20);
  }
  const wrapcert::detail::RecordSource records =
      [&sizes](const std::string& name) -> std::optional<std::pair<at::DataPtr, size_t>> {
    const auto it = sizes.find(name);
    if (it == sizes.end()) return std::nullopt;
    auto bytes = c10::GetCPUAllocator()->allocate(it->second);
    if (it->second) std::memset(bytes.get(), 0x5a, it->second);
    return std::make_pair(std::move(bytes), it->second);
  };
  try {
    const auto state =
        wrapcert::detail::read_state_dict_pickle(pickle.data(), pickle.size(), records, "<fuzz>");
    for (const auto& entry : state) {
      // Every element of every tensor must be readable: views stay inside their storage.
      const auto& t = entry.value();
      if (t.numel() > 0) (void)t.contiguous().sum().item<double>();
    }
  } catch (const Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
