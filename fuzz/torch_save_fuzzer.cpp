// The pickle machine that reads `torch.save`d checkpoints, on arbitrary pickles, with the
// nested-entry lookup. An input is the pickle, optionally followed by "\0RECORDS\0" and lines
// (fuzz/make_corpus.py writes the seeds so); an "entry NAME" line names the entry to look up.
#include "fuzz_support.h"

#include <wrapcert/io/detail/pickle.h>

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
  // After the marker, an optional "entry NAME" line: the nested entry to look up.
  std::string entry;
  if (marker != std::string_view::npos) {
    std::istringstream table(std::string(input.substr(marker + kMarker.size())));
    std::string word;
    while (table >> word) {
      if (word == "entry") table >> entry;
    }
  }
  try {
    const auto pickled =
        wrapcert::detail::read_state_dict_pickle(pickle.data(), pickle.size(), "<fuzz>", entry);
    // Every element of every tensor must lie in its storage: materialise small storages and
    // read each view whole.
    size_t i = 0;
    for (const auto& item : pickled.state) {
      const auto& storage = pickled.storages.at(pickled.storage_of.at(i++));
      const auto& meta = item.value();
      if (storage.numel > (1 << 20)) continue;
      auto data = torch::zeros({storage.numel}, torch::TensorOptions().dtype(storage.dtype));
      auto view = data.as_strided(meta.sizes(), meta.strides(), meta.storage_offset());
      if (view.numel() > 0) (void)view.contiguous().to(torch::kDouble).sum().item<double>();
    }
  } catch (const Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
