#pragma once
/// Direct access to a module's own tables, which LibTorch keeps protected or private: its
/// parameters, changed by weight tying and flattening wrappers, and all three tables read in
/// place by walks over large trees.

#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace wrapcert::detail {

using ChildTable = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;
using TensorTable = torch::OrderedDict<std::string, torch::Tensor>;

/// A module's own tables, read in place, in registration order: `named_children()`,
/// `named_parameters(false)` and `named_buffers(false)` copy theirs (names, values and a hash
/// index) on every call. Parameter and buffer entries may be undefined tensors.
const ChildTable& child_table(const torch::nn::Module& module);
const TensorTable& parameter_table(const torch::nn::Module& module);
const TensorTable& buffer_table(const torch::nn::Module& module);

/// The registered parameter `name` of `owner` (not of its children), or nullptr.
torch::Tensor* find_parameter(torch::nn::Module& owner, const std::string& name);
/// Removes a registered parameter (no-op if absent).
void erase_parameter(torch::nn::Module& owner, const std::string& name);
/// Registers `tensor` as parameter `name`, replacing one of that name, else appending.
void insert_parameter(torch::nn::Module& owner, const std::string& name,
                      const torch::Tensor& tensor);

}  // namespace wrapcert::detail
