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

#include <wrapcert/registry.h>

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

/// Activation checkpointing. Runs `module` on `input` under no-grad and returns an output whose
/// backward re-runs the module with grad enabled and differentiates it, for the input and every
/// parameter of the module. `module` must outlive the backward pass. Randomness in the module
/// (dropout) is not replayed: checkpoint only deterministic modules. Gradients equal an ordinary
/// run's bit for bit (CPU, same kernels).
///
///   wrapcert::checkpoint_in_place(layer);        // torch_xla's checkpoint_module: no new level
///   auto y = wrapcert::call(*layer, x);           // now runs checkpointed
torch::Tensor checkpointed_call(torch::nn::Module& module, const torch::Tensor& input);
/// Marks `module` so that `call` runs it checkpointed: what torch_xla's `checkpoint_module` does
/// by patching `forward`, adding no module level and no key.
void checkpoint_in_place(const ModulePtr& module);
bool is_checkpointed(const torch::nn::Module& module);

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

/// The class name PyTorch would print for `module`: a `Layer`'s `python_name()`, `Linear` for
/// `torch::nn::LinearImpl`, else the C++ type name without namespaces and `Impl` suffix.
std::string python_type_name(const torch::nn::Module& module);
/// PyTorch's `extra_repr()` for a `Layer` or a LibTorch built-in; empty otherwise.
std::string python_extra_repr(const torch::nn::Module& module);

}  // namespace wrapcert
