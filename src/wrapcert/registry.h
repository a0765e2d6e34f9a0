#pragma once
/// Wrapper kinds and the registry that recognises them by C++ type, never by a child's name.
///
///   auto kind = wrapcert::wrapper_kind<MyShardImpl>("MyShard", "_sharded_module");
///   wrapcert::Registry::global().add(kind);
///   auto model = wrapcert::wrap(model, "layers.0", "MyShard");
///
/// A descriptor says where the inner module sits (`slot`), what else reaches it (`aliases`,
/// attribute forwarding), and how to get it back (`inner`, `release`).

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>
#include <unordered_map>
#include <vector>

namespace wrapcert {

/// What property P4 may expect when a model runs through this wrapper.
enum class Numerics {
  kBitwise,        ///< outputs and gradients equal the unwrapped module's bit for bit
  kTolerance,      ///< equal within `WrapperKind::tolerance`
  kChangesOutput,  ///< the wrapped run differs by design; compare the unwrapped to the original
  kNeedsRelease,   ///< the inner module does not compute until released (flat parameters)
};

using ModulePtr = std::shared_ptr<torch::nn::Module>;

struct WrapperKind {
  WrapperKind(std::string name, std::type_index type, std::string slot)
      : name(std::move(name)), type(type), slot(std::move(slot)) {}

  /// The class name as PyTorch prints it (`SpmdFullyShardedDataParallel`).
  std::string name;
  /// The wrapper's C++ type; a module is of this kind iff `typeid(module) == type`.
  std::type_index type;
  /// The child name the inner module is registered under (`_orig_module`); shows in keys.
  std::string slot;
  /// Other attribute names that reach the inner module (FSDPv2's `module` property).
  std::vector<std::string> aliases;
  /// Attribute access on the wrapper falls through to the inner module (`torch.compile`).
  bool forwards_attributes = false;
  /// The wrapper holds parameters, buffers or children of its own besides the slot.
  bool owns_state = false;
  /// The real wrapper's `state_dict()` leaves its slot out of the keys (torch's
  /// `CheckpointWrapper` strips `_checkpoint_wrapped_module.` with a state-dict hook), though
  /// `named_parameters()` shows it.
  bool state_dict_hides_slot = false;
  Numerics numerics = Numerics::kBitwise;
  /// Relative and absolute tolerance when `numerics` is `kTolerance`.
  double tolerance = 0.0;
  /// Builds a wrapper of this kind around `inner`.
  std::function<ModulePtr(ModulePtr inner)> make;
  /// The inner module, without changing anything. Default: the child registered at `slot`.
  std::function<ModulePtr(const torch::nn::Module& wrapper)> inner;
  /// Gives the inner module back its own state (flat parameters restored) and returns it; for
  /// kinds that own state. Null: nothing to release.
  std::function<ModulePtr(torch::nn::Module& wrapper)> release;

  /// Resolves `inner`, throwing `Error` (kEmptySlot) with `path` when the slot is empty.
  ModulePtr inner_of(const torch::nn::Module& wrapper, const std::string& path) const;
};

/// A descriptor for wrapper type `W`, constructible from the inner module, with defaults.
template <typename W>
WrapperKind wrapper_kind(std::string name, std::string slot) {
  WrapperKind kind(std::move(name), typeid(W), std::move(slot));
  kind.make = [](ModulePtr inner) -> ModulePtr { return std::make_shared<W>(std::move(inner)); };
  return kind;
}

/// The child registered as `name` in `module`, or nullptr.
ModulePtr find_child(const torch::nn::Module& module, const std::string& name);

class Registry {
 public:
  /// The process-wide registry, holding the built-in kinds. Register kinds before use;
  /// registration is not synchronised with concurrent lookups.
  static Registry& global();
  /// A new registry holding only the built-in kinds.
  static Registry with_builtins();

  /// Adds a kind; throws `Error` (kDuplicateKind) if its name or type is already registered.
  void add(WrapperKind kind);

  /// The kind of `module`'s dynamic type, or nullptr when it is not a wrapper.
  const WrapperKind* find(const torch::nn::Module& module) const;
  /// The kind called `name`; throws `Error` (kUnknownWrapper) listing the known names.
  const WrapperKind& at(std::string_view name) const;
  bool contains(std::string_view name) const;

  const std::vector<WrapperKind>& kinds() const { return kinds_; }
  std::vector<std::string> names() const;

 private:
  std::vector<WrapperKind> kinds_;
  std::unordered_map<std::type_index, size_t> by_type_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace wrapcert
