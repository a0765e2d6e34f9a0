#pragma once
/// Small modules for wrapcert's own tests: a user module with a child named like a wrapper slot,
/// a chain builder, and a helper to compare tensors (key lists: HasKeys in matchers.h).
///
///   auto m = wrapcert::test_support::norm_with_module_child();  // has `module`, `extra`, `scale`

#include <wrapcert/layer.h>
#include <wrapcert/view.h>

#include <string>

namespace wrapcert::test_support {

/// A user module (not a wrapper) that keeps a child named `slot_name` beside other state, as
/// user code does (docs/SEMANTICS.md §2, hazard 2).
class UserModuleImpl : public Layer {
 public:
  explicit UserModuleImpl(std::string slot_name = "module", int64_t dim = 3);
  torch::Tensor forward(const torch::Tensor& x) override;
  std::string python_name() const override { return "UserNorm"; }

 private:
  std::string slot_name_;
};

/// Sequential-like custom block: runs its children in registration order, by name.
class ChainImpl : public Layer {
 public:
  ChainImpl() = default;
  torch::Tensor forward(const torch::Tensor& x) override;
  std::string python_name() const override { return "Chain"; }
};

/// True when every tensor in `a` is the very tensor (same TensorImpl) under the same key in `b`.
bool same_tensors(const StateDict& a, const StateDict& b);

}  // namespace wrapcert::test_support
