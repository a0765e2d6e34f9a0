#pragma once
/// Direct access to a module's table of registered parameters, which LibTorch keeps protected:
/// what weight tying and flattening wrappers need.

#include <torch/nn/module.h>

#include <string>

namespace wrapcert::detail {

/// The registered parameter `name` of `owner` (not of its children), or nullptr.
torch::Tensor* find_parameter(torch::nn::Module& owner, const std::string& name);
/// Removes a registered parameter (no-op if absent).
void erase_parameter(torch::nn::Module& owner, const std::string& name);
/// Registers `tensor` as parameter `name`, replacing one of that name, else appending.
void insert_parameter(torch::nn::Module& owner, const std::string& name,
                      const torch::Tensor& tensor);

}  // namespace wrapcert::detail
