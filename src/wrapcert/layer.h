#pragma once
/// How wrapcert calls modules: `Layer`, the base of modules whose children may be wrapped, and
/// `call`, which runs any module's forward through a type-erased table.
///
///   struct BlockImpl : wrapcert::Layer {
///     BlockImpl() { register_module("fc", torch::nn::Linear(4, 4)); }
///     torch::Tensor forward(const torch::Tensor& x) override { return call_child("fc", x); }
///   };
///
/// Why: a LibTorch parent usually calls a child through a member holder
/// (`torch::nn::Linear fc{nullptr}`), so replacing the child in the registry changes the keys
/// but not what `forward` runs. A `Layer` looks its children up in the registry at call time,
/// so a wrapper put into the registry is on the forward path, and so is its removal.

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <typeindex>

namespace wrapcert {

/// Base for modules with a single-tensor forward whose children are resolved by name.
class Layer : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  virtual torch::Tensor forward(const torch::Tensor& input) = 0;

  /// The class name PyTorch would print (`GemmaDecoderLayer`). Defaults to the C++ type name
  /// without namespace and `Impl` suffix.
  virtual std::string python_name() const;
  /// PyTorch's `extra_repr()`: what goes between the parentheses (`in_features=4, ...`).
  virtual std::string extra_repr() const { return {}; }

 protected:
  /// The parameter registered as `name` now (a flattening wrapper may have put a view there).
  /// Throws `Error`: kWrapperState when a flat-parameter wrapper holds it (release the wrapper
  /// first), kUnknownKey when there is none.
  torch::Tensor parameter(const std::string& name) const;
  /// Runs the child registered as `name` (whatever module is there now, wrapper or not).
  torch::Tensor call_child(const std::string& name, const torch::Tensor& input);
};

/// Runs `module.forward(input)` for a `Layer`, a LibTorch built-in (`Linear`, `Embedding`,
/// `LayerNorm`, `Sequential`, activations, `Identity`, `Dropout`) or a type registered with
/// `register_forward`. Throws `Error` (kNotForwardable) for any other type. A module marked by
/// `checkpoint_in_place` runs checkpointed.
torch::Tensor call(torch::nn::Module& module, const torch::Tensor& input);

namespace detail {
/// `call` without the checkpointing check (what a checkpointed run calls inside).
torch::Tensor call_direct(torch::nn::Module& module, const torch::Tensor& input);
}  // namespace detail

using ForwardFn = std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)>;

/// Teaches `call` how to run a module type that is not a `Layer`.
void register_forward(std::type_index type, ForwardFn fn);

template <typename ModuleImpl>
void register_forward() {
  register_forward(typeid(ModuleImpl), [](torch::nn::Module& m, const torch::Tensor& x) {
    return dynamic_cast<ModuleImpl&>(m).forward(x);  // LibTorch modules derive virtually
  });
}

}  // namespace wrapcert

namespace wrapcert {

/// Makes `owner`'s registered parameter `name` the very tensor `tensor` (one storage, one
/// gradient), as `lm_head.weight = embed_tokens.weight` does in Python. LibTorch 1.13 has no
/// public way to replace a registered parameter; assigning a member holder does not do it.
/// Throws `Error` (kUnknownKey) if `owner` has no parameter `name`.
void tie_parameter(torch::nn::Module& owner, const std::string& name, const torch::Tensor& tensor);

namespace detail {
/// Removes a registered parameter (no-op if absent): what flattening wrappers need.
void erase_parameter(torch::nn::Module& owner, const std::string& name);
/// Registers `tensor` as parameter `name`, replacing one of that name, else appending.
void insert_parameter(torch::nn::Module& owner, const std::string& name,
                      const torch::Tensor& tensor);
}  // namespace detail

}  // namespace wrapcert
