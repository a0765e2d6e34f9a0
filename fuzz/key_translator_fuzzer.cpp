// The key translator on arbitrary key strings, over the seed's wrapped Gemma: a key is either
// translated, and translates back to itself, or refused with an Error naming it. The same
// strings drive `removes_whole_components` against a plain split-and-match model of it.
#include "fuzz_support.h"

#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/keys.h>

#include <fuzzer/FuzzedDataProvider.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <vector>

namespace {

const wrapcert::KeyTranslator& translator() {
  static const auto tr = [] {
    const auto config = wrapcert::fixtures::tiny_gemma();
    auto model = wrapcert::fixtures::apply_fsdp_v2_recipe(
        wrapcert::fixtures::make_causal_lm(config, {c10::kMeta}), config);
    return wrapcert::KeyTranslator::from_tree(model);
  }();
  return tr;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '.') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

bool removes_whole_components_model(const std::string& wrapped, const std::string& clean) {
  const auto w = split(wrapped), c = split(clean);
  size_t i = 0;
  for (const auto& want : c) {
    while (i < w.size() && w[i] != want) ++i;
    if (i == w.size()) return false;
    ++i;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  (void)translator();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wrapcert;
  FuzzedDataProvider in(data, size);
  const auto& tr = translator();
  // Start from a real key now and then, so edits of real keys are explored too.
  std::string key;
  if (in.ConsumeBool()) {
    key = tr.pairs()[in.ConsumeIntegralInRange<size_t>(0, tr.size() - 1)].first;
    key.insert(in.ConsumeIntegralInRange<size_t>(0, key.size()), in.ConsumeRandomLengthString(8));
  } else {
    key = in.ConsumeRandomLengthString(256);
  }
  for (const bool wrapped_side : {true, false}) {
    try {
      const auto& other = wrapped_side ? tr.to_clean(key) : tr.to_wrapped(key);
      const auto& back = wrapped_side ? tr.to_wrapped(other) : tr.to_clean(other);
      if (back != key) fuzz::violated("'" + key + "' does not translate back to itself");
      const auto& w = wrapped_side ? key : other;
      const auto& c = wrapped_side ? other : key;
      if (!removes_whole_components(w, c)) fuzz::violated("'" + w + "' -> '" + c + "'");
    } catch (const Error& e) {
      fuzz::check_error(e);
      if (e.code() != ErrorCode::kUnknownKey || e.key_path() != key) fuzz::violated(e.what());
    }
  }
  const auto other = in.ConsumeRemainingBytesAsString();
  if (removes_whole_components(key, other) != removes_whole_components_model(key, other)) {
    fuzz::violated("removes_whole_components('" + key + "', '" + other + "') disagrees");
  }
  return 0;
}
