#include <wrapcert/test_support/models.h>

#include <torch/nn/modules/linear.h>

#include <utility>

namespace wrapcert::test_support {

UserModuleImpl::UserModuleImpl(std::string slot_name, int64_t dim)
    : slot_name_(std::move(slot_name)) {
  register_parameter("scale", torch::ones({dim}));
  register_module(slot_name_, torch::nn::Linear(dim, dim));
  register_module("extra", torch::nn::Linear(dim, dim));
}

torch::Tensor UserModuleImpl::forward(const torch::Tensor& x) {
  return call_child("extra", call_child(slot_name_, x)) * parameter("scale");
}

torch::Tensor ChainImpl::forward(const torch::Tensor& x) {
  auto h = x;
  for (const auto& item : named_children()) h = call(*item.value(), h);
  return h;
}

bool same_tensors(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& item : a) {
    const auto* other = b.find(item.key());
    if (!other || !other->is_same(item.value())) return false;
  }
  return true;
}

}  // namespace wrapcert::test_support
