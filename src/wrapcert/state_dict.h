#pragma once
/// The state dict of a module tree as it is (wrappers included), strict loading, and which
/// buffers it holds.
///
///   auto sd = wrapcert::state_dict(model);             // torch.nn.Module.state_dict() order
///   wrapcert::load_state_dict(fresh, sd);               // strict: same keys, shapes, dtypes
///   wrapcert::mark_non_persistent(rope, "inv_freq");   // register_buffer(..., persistent=False)

#include <wrapcert/view.h>

#include <string>
#include <vector>

namespace wrapcert {

/// The state dict of a module tree as it is (wrappers included).
StateDict state_dict(const ModulePtr& root);
/// Loads `state` into the state dict of `root` as it is, strictly: every key present on both
/// sides with the same shape and dtype, values copied in place. Throws `Error` naming the first
/// offending key: kUnknownKey for an unexpected or missing key, kInvalidArgument for a shape or
/// dtype mismatch. Nothing is copied unless everything matches.
void load_state_dict(const ModulePtr& root, const StateDict& state);

/// The keys of a state dict, in order.
std::vector<std::string> keys(const StateDict& state);

/// Marks a registered buffer of `module` as non-persistent (PyTorch's
/// `register_buffer(..., persistent=False)`): it stays in `named_buffers()` but leaves every
/// wrapcert state dict. Throws `Error` (kUnknownKey) if `module` has no such buffer.
void mark_non_persistent(const ModulePtr& module, const std::string& buffer);
bool is_persistent(const torch::nn::Module& module, const std::string& buffer);

}  // namespace wrapcert
