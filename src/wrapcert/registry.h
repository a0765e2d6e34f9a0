#pragma once
/// Wrapper kinds and the registry that recognises them by C++ type, never by a child's name.
///
///   auto kind = wrapcert::wrapper_kind<MyShardImpl>("MyShard", "_sharded_module");
///   wrapcert::Registry::global().add(kind);
///   auto model = wrapcert::wrap(model, "layers.0", "MyShard");
///
/// A descriptor says where the inner module sits (`slot`), what else reaches it (`aliases`,
/// attribute forwarding), what it holds besides (`owned_state`), and how to get the inner module
/// back (`inner`, `release`). Certification checks each of these declarations; none is taken on
/// faith.

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
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
  /// The wrapped model computes bit for bit like the model (gradients reaching the flat state
  /// that holds each parameter), but the inner module alone does not compute until released
  /// (flat parameters).
  kNeedsRelease,
};

using ModulePtr = std::shared_ptr<torch::nn::Module>;

/// What a wrapper does with the gradients of the ranks (`torch.distributed`'s reduce op): torch's
/// `DistributedDataParallel` and `FullyShardedDataParallel` average them.
enum class GradientReduction { kMean, kSum };

/// How a kind behaves across the ranks of a process group, for certification at a world size
/// above one (`certify::run_ranks`, `wrapcert certify --world-size N`).
struct AcrossRanks {
  /// Certified across ranks: it synchronises gradients (and may shard state) over
  /// `ProcessGroup::current()`.
  bool certify = false;
  /// May wrap modules inside a wrapper of its own kind (FSDP units); false: the root only (DDP).
  bool nests = true;
  GradientReduction reduction = GradientReduction::kMean;
  /// Mixed precision: the wrapped forward and backward compute in this dtype (parameters and
  /// inputs cast, outputs cast back) while the shards and their gradients stay in the model's.
  std::optional<c10::ScalarType> compute_dtype;
};

/// Another way to build wrappers of a kind, certified on its own as `Kind[mode]`
/// (`FullyShardedDataParallel[flat]`: `use_orig_params=False`, flat parameters).
struct WrapperMode {
  WrapperMode(std::string name, std::function<ModulePtr(ModulePtr inner)> make,
              Numerics numerics = Numerics::kBitwise)
      : name(std::move(name)), make(std::move(make)), numerics(numerics) {}
  std::string name;
  std::function<ModulePtr(ModulePtr inner)> make;
  Numerics numerics = Numerics::kBitwise;
  /// How this mode behaves across ranks; unset: as its kind does.
  std::optional<AcrossRanks> ranks;
  /// Differs from the kind only across ranks (sharded state): certified at world sizes above
  /// one, and left out of single-process certification, where it would run as the kind does.
  bool ranks_only = false;
};

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
  /// What the attribute `alias` reaches on `wrapper`, as the real wrapper's property computes
  /// it. Default: the child registered under that name, else the module at the slot.
  std::function<ModulePtr(const torch::nn::Module& wrapper, const std::string& alias)> alias_target;
  /// Attribute access on the wrapper falls through to the inner module (`torch.compile`).
  bool forwards_attributes = false;
  /// The names of the parameters, buffers and children the wrapper holds besides its slot
  /// (`_flat_param`). Anything else it holds is an error when unwrapping; none of it may be the
  /// model's own module or tensor.
  std::vector<std::string> owned_state;
  /// The real wrapper's `state_dict()` leaves its slot out of the keys (torch's
  /// `CheckpointWrapper` strips `_checkpoint_wrapped_module.` with a state-dict hook), though
  /// `named_parameters()` shows it.
  bool state_dict_hides_slot = false;
  Numerics numerics = Numerics::kBitwise;
  /// Relative and absolute tolerance when `numerics` is `kTolerance`, in machine epsilons of the
  /// dtype compared (64: within 64 * 2^-52 in double, 64 * 2^-23 in float32), so that one
  /// declaration holds in every dtype certified.
  double tolerance = 0.0;
  /// Builds a wrapper of this kind around `inner`.
  std::function<ModulePtr(ModulePtr inner)> make;
  /// The inner module, without changing anything. Default: the child registered at `slot`.
  std::function<ModulePtr(const torch::nn::Module& wrapper)> inner;
  /// Gives the inner module back its own state (flat parameters restored) and returns it: the
  /// very module in the slot, which stays there (the wrapper still runs, passing calls
  /// through). For kinds that own state. Null: nothing to release.
  std::function<ModulePtr(torch::nn::Module& wrapper)> release;
  /// Other ways to build it (`modes[i].name` names it `Kind[mode]`).
  std::vector<WrapperMode> modes;
  /// How it behaves across ranks (not at all, by default).
  AcrossRanks ranks;

  /// Resolves `inner`, throwing `Error` (kEmptySlot) with `path` when the slot is empty.
  ModulePtr inner_of(const torch::nn::Module& wrapper, const std::string& path) const;
  /// Resolves `alias_target` (or its default) for `alias`, throwing `Error` (kEmptySlot) with
  /// `path` when it reaches nothing.
  ModulePtr alias_of(const torch::nn::Module& wrapper, const std::string& alias,
                     const std::string& path) const;
  /// Whether `name` is declared in `owned_state`.
  bool owns(const std::string& name) const;
};

/// A kind, or one of its modes, as named in a certification (`Kind` or `Kind[mode]`).
struct KindRef {
  const WrapperKind* kind = nullptr;
  const WrapperMode* mode = nullptr;  ///< null: the kind's own `make`

  std::string name() const;
  ModulePtr make(ModulePtr inner) const;
  Numerics numerics() const;
  /// The mode's `ranks`, else the kind's.
  const AcrossRanks& ranks() const;
  /// The kind's descriptor with the mode's `make` and `numerics` (for `auto_wrap`).
  WrapperKind descriptor() const;
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
  /// The kind or mode called `name` (`Kind` or `Kind[mode]`); throws `Error` (kUnknownWrapper)
  /// listing the known names.
  KindRef resolve(std::string_view name) const;

  const std::vector<WrapperKind>& kinds() const { return kinds_; }
  std::vector<std::string> names() const;
  /// Every kind's name, each followed by its modes' `Kind[mode]` names: what certification
  /// covers by default (modes that differ only across ranks left out).
  std::vector<std::string> names_with_modes() const;
  /// Every kind and mode that declares `ranks.certify`: what certification across ranks covers
  /// by default.
  std::vector<std::string> names_across_ranks() const;

 private:
  std::vector<WrapperKind> kinds_;
  std::unordered_map<std::type_index, size_t> by_type_;
  std::unordered_map<std::string, size_t> by_name_;
};

/// Registers `kind` in the global registry for the scope's lifetime (unless a kind of its name is
/// registered already) and puts the registry back as it was when the scope ends, so that what
/// one run registers never reaches the next.
class ScopedRegistration {
 public:
  explicit ScopedRegistration(const WrapperKind& kind);
  ~ScopedRegistration();
  ScopedRegistration(const ScopedRegistration&) = delete;
  ScopedRegistration& operator=(const ScopedRegistration&) = delete;

 private:
  Registry saved_;
};

}  // namespace wrapcert
