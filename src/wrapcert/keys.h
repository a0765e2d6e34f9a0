#pragma once
/// Translating state-dict keys between a wrapped model and its clean (unwrapped) form.
///
///   auto tr = wrapcert::KeyTranslator::from_tree(wrapped);
///   tr.to_clean("_orig_module.model.layers.0._orig_module.mlp.down_proj.weight");
///       // "model.layers.0.mlp.down_proj.weight"
///   tr.to_wrapped("model.norm.weight");  // "_orig_module.model.norm.weight"
///
/// The translation comes from the tree, not from spelling: a component is removed only where
/// the wrapped path really passes through a registered wrapper's slot, so a user child named
/// `module` or `my_fsdp_wrapped_module` is never touched.

#include <wrapcert/view.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace wrapcert {

class KeyTranslator {
 public:
  KeyTranslator(const KeyTranslator&) = delete;  // the indexes point into `pairs_`
  KeyTranslator& operator=(const KeyTranslator&) = delete;
  KeyTranslator(KeyTranslator&&) noexcept = default;
  KeyTranslator& operator=(KeyTranslator&&) noexcept = default;

  /// Reads every state-dict key of `wrapped` and its clean form. Throws `Error` as
  /// `unwrap_reference` does, and (kKeyCollision) if two keys would translate to one.
  static KeyTranslator from_tree(const ModulePtr& wrapped,
                                 const Registry& registry = Registry::global());

  /// Throws `Error` (kUnknownKey) naming the key when the tree has no such key, or when the key
  /// is a wrapper's own declared state (`_flat_param`): that has no clean key, and the error
  /// says so.
  const std::string& to_clean(std::string_view wrapped_key) const;
  const std::string& to_wrapped(std::string_view clean_key) const;

  /// Translates every key of `state`, keeping order and tensors.
  StateDict to_clean(const StateDict& state) const;
  StateDict to_wrapped(const StateDict& state) const;

  /// (wrapped, clean) pairs in state-dict order.
  const std::vector<std::pair<std::string, std::string>>& pairs() const { return pairs_; }
  size_t size() const { return pairs_.size(); }

 private:
  KeyTranslator() = default;

  std::vector<std::pair<std::string, std::string>> pairs_;
  std::unordered_map<std::string_view, size_t> by_wrapped_;
  std::unordered_map<std::string_view, size_t> by_clean_;
  std::unordered_set<std::string> wrapper_state_;  ///< keys of the wrappers' own state
};

/// True when `clean`'s dotted components are `wrapped`'s with some whole components removed
/// (never a part of one), in the same order.
bool removes_whole_components(std::string_view wrapped, std::string_view clean);

}  // namespace wrapcert
