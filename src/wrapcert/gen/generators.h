#pragma once
/// rapidcheck generators of wrapper trees (specs, never modules), and how a spec prints.
///
///   RC_GTEST_PROP(Unwrap, KeepsKeys, ()) {
///     const auto spec = *wrapcert::gen::trees();
///     ...
///   }
///
/// A failing case shrinks (children removed, subtrees offered as replacements, wrapper stacks
/// shortened) and prints as the wrapped model's PyTorch tree with its keys.

#include <wrapcert/gen/spec.h>

#include <rapidcheck/Gen.h>

#include <iosfwd>
#include <string>
#include <vector>

namespace wrapcert::gen {

struct GenOptions {
  /// Wrapper kinds to draw from; empty means every kind in the global registry.
  std::vector<std::string> kinds;
  bool wrappers = true;           ///< false: plain trees
  bool adversarial_names = true;  ///< children named like slots, or containing a slot name
  bool sharing = true;            ///< shared submodules and tied weights
  int max_depth = 3;
  /// Wrappers only in a chain at the root (the case where legacy unwrap is right).
  bool root_chain_only = false;
  /// Dtypes to draw trees in (one per tree); empty means double alone.
  std::vector<Dtype> dtypes;
  /// Draw eval mode as often as training mode; false: training mode alone.
  bool eval_mode = false;
  /// Draw what training varies in the leaves too: frozen parameters, leaves that compute
  /// differently in eval mode, and LibTorch's own (cloneable) `Linear` beside wrapcert's leaves.
  /// Widths (1 to 8) and batch sizes (1 to 5) are drawn either way.
  bool training = true;
};

rc::Gen<TreeSpec> trees(GenOptions options = {});

/// The spec's wrapped model as PyTorch prints it, then its wrapped state-dict keys; with
/// `highlight`, the keys that are it or end with it are marked `<-- here`.
std::string describe(const TreeSpec& spec, const std::string& highlight = {});
struct Built;
/// The same for a model already built from `spec` (`build(spec)`, not run yet).
std::string describe(const TreeSpec& spec, const Built& built, const std::string& highlight = {});
/// rapidcheck's printer hook.
void showValue(const TreeSpec& spec, std::ostream& os);

/// Tags the current rapidcheck case with depth, wrapper kinds, ties, sharing and adversarial
/// names, so a run shows what it exercised. Call inside a property.
void classify(const TreeSpec& spec);

}  // namespace wrapcert::gen
