#pragma once
/// One tree printer, in PyTorch's Python format or LibTorch's, and a flat key listing.
///
///   std::cout << wrapcert::format_tree(wrapcert::unwrap_reference(model));
///   // GemmaForCausalLM(
///   //   (model): GemmaModel(
///   //     (layers): ModuleList(
///   //       (0-17): 18 x GemmaDecoderLayer(
///
/// `operator<<`, googletest's `PrintTo` and rapidcheck's `showValue` all go through here.

#include <wrapcert/view.h>

#include <iosfwd>
#include <string>

namespace wrapcert {

enum class PrintStyle {
  kPython,    ///< `Linear(in_features=4, out_features=4, bias=False)`, `GemmaDecoderLayer(`
  kLibTorch,  ///< what LibTorch's `operator<<` prints: `torch::nn::Linear(..., bias=false)`
};

struct PrintOptions {
  PrintStyle style = PrintStyle::kPython;
  /// PyTorch >= 2.0 prints runs of identical `ModuleList` elements as `(0-17): 18 x ...`;
  /// turn off for the older, one-line-per-element form. Python style only.
  bool compress_repeated = true;
};

std::string format_tree(const ModuleView& view, const PrintOptions& options = {});
/// The tree as it is (wrappers shown).
std::string format_tree(const ModulePtr& module, const PrintOptions& options = {});

/// One line per entry: `key  [shape]  dtype  storage`, where `storage` is a small number
/// given to each distinct storage in order of appearance, so tied and shared tensors show the
/// same number (`#0`), e.g. `lm_head.weight  [256000, 2048]  float32  #0`.
std::string format_keys(const StateDict& state);

std::ostream& operator<<(std::ostream& out, const ModuleView& view);
/// googletest's printer hook.
void PrintTo(const ModuleView& view, std::ostream* out);

}  // namespace wrapcert
