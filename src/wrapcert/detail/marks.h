#pragma once
/// Tags on live modules that LibTorch has no field for (a non-persistent buffer, a module
/// checkpointed in place). Keyed by address, guarded by a weak pointer, so a tag never outlives
/// its module nor carries over to a new module at a reused address.
///
///   detail::add_mark(module, "checkpointed");
///   if (detail::has_mark(*module, "checkpointed")) ...

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wrapcert::detail {

void add_mark(const std::shared_ptr<torch::nn::Module>& module, std::string mark);
void remove_mark(const torch::nn::Module& module, std::string_view mark);
/// Cheap when no module carries any mark.
bool has_mark(const torch::nn::Module& module, std::string_view mark);
/// The mark of a non-persistent buffer (`wrapcert::mark_non_persistent`).
inline std::string non_persistent_mark(const std::string& buffer) {
  return "non-persistent:" + buffer;
}

/// Parameters a flattening wrapper took out of `owner`'s registry, in registration order: what
/// the module holds once the wrapper releases it. Views that see through wrappers show them.
void hold_parameters(const std::shared_ptr<torch::nn::Module>& owner,
                     std::vector<std::pair<std::string, torch::Tensor>> params);
void drop_held_parameters(const torch::nn::Module& owner);
std::vector<std::pair<std::string, torch::Tensor>> held_parameters(const torch::nn::Module& owner);

}  // namespace wrapcert::detail
