#pragma once
/// The built-in wrapper kinds: one C++ type per real wrapper, each storing the inner module under
/// the real wrapper's slot name, so keys look exactly like the real ones.
///
///   auto wrapped = std::make_shared<wrapcert::SpmdFullyShardedDataParallelImpl>(model);
///   wrapped->forward(x);   // runs model through the wrapper; wrapped->calls() == 1
///
/// Each kind counts its calls; DDP all-reduces gradients (`distributed.h`), FSDP can hold flat
/// parameters (`flat_parameters.h`), CheckpointWrapper recomputes activations in backward.

#include <wrapcert/flat_parameters.h>
#include <wrapcert/layer.h>
#include <wrapcert/registry.h>
#include <wrapcert/sharding.h>

#include <cstdint>
#include <string>

namespace wrapcert {

/// Base of wrappers: registers the inner module at `slot`, forwards to whatever module the
/// slot holds now, and counts calls so tests can prove a run went through it.
class WrapperImpl : public Layer {
 public:
  WrapperImpl(std::string kind_name, std::string slot, ModulePtr inner);

  /// Counts the call, then `run`s it.
  torch::Tensor forward(const torch::Tensor& input) final;

  /// The module at the slot; throws `Error` (kEmptySlot) when there is none. Virtual, for a
  /// wrapper whose inner module is not simply its slot's (its kind's `inner` says the same).
  virtual ModulePtr inner() const;
  const std::string& slot() const { return slot_; }
  const std::string& kind_name() const { return kind_name_; }

  std::int64_t calls() const { return calls_; }
  void reset_calls() { calls_ = 0; }

  std::string python_name() const override { return kind_name_; }

 protected:
  /// What the wrapper does with a call; by default, calls the inner module.
  virtual torch::Tensor run(const torch::Tensor& input);

 private:
  std::string kind_name_;
  std::string slot_;
  std::int64_t calls_ = 0;
};

namespace detail {
/// One distinct C++ type per pass-through kind, so that recognition by type tells them apart.
template <typename Tag>
class PassThroughWrapperImpl final : public WrapperImpl {
 public:
  explicit PassThroughWrapperImpl(ModulePtr inner)
      : WrapperImpl(Tag::kName, Tag::kSlot, std::move(inner)) {}
};

// clang-format off
struct DataParallelTag { static constexpr const char* kName = "DataParallel"; static constexpr const char* kSlot = "module"; };
struct OptimizedModuleTag { static constexpr const char* kName = "OptimizedModule"; static constexpr const char* kSlot = "_orig_mod"; };
struct DeepSpeedEngineTag { static constexpr const char* kName = "DeepSpeedEngine"; static constexpr const char* kSlot = "module"; };
// clang-format on
}  // namespace detail

/// `torch.nn.DataParallel` (`module`): on the CPU, a pass-through.
using DataParallelImpl = detail::PassThroughWrapperImpl<detail::DataParallelTag>;
/// What `torch.compile` returns (`_orig_mod`): holds the original and forwards to it, and
/// forwards attribute access (its descriptor says so). Real compilation does not change keys.
using OptimizedModuleImpl = detail::PassThroughWrapperImpl<detail::OptimizedModuleTag>;
/// DeepSpeed's engine (`module`; forwards attribute access).
using DeepSpeedEngineImpl = detail::PassThroughWrapperImpl<detail::DeepSpeedEngineTag>;

/// torch's activation `CheckpointWrapper` (`_checkpoint_wrapped_module`): runs the inner module
/// without keeping activations; backward recomputes them.
class CheckpointWrapperImpl final : public WrapperImpl {
 public:
  explicit CheckpointWrapperImpl(ModulePtr inner);

 protected:
  torch::Tensor run(const torch::Tensor& input) override;
};

struct SpmdOptions {
  /// Every parameter of the subtree (but those under a nested `SpmdFullyShardedDataParallel`)
  /// sharded along its first dimension across `ProcessGroup::current()`, as XLA shards it over a
  /// one-dimensional mesh (`ShardedParameters`); keys keep `_orig_module`.
  bool sharded = false;
};

/// torch_xla's `SpmdFullyShardedDataParallel` (`_orig_module`, alias `module`), the seed's
/// wrapper. `shard_output`, when given, is called on every forward output (torch_xla marks its
/// sharding there).
class SpmdFullyShardedDataParallelImpl final : public WrapperImpl, public ShardedModule {
 public:
  using ShardOutput = std::function<void(const torch::Tensor& output)>;
  explicit SpmdFullyShardedDataParallelImpl(ModulePtr inner, ShardOutput shard_output = nullptr);
  SpmdFullyShardedDataParallelImpl(ModulePtr inner, SpmdOptions options);

  /// Gives every module its own parameters back, gathered (a collective when sharded); returns
  /// the inner module.
  ModulePtr release();
  std::vector<LocalShard> local_shards() const override;
  std::vector<std::pair<std::string, torch::Tensor>> full_state_dict(int root) override;

 protected:
  torch::Tensor run(const torch::Tensor& input) override;

 private:
  ShardOutput shard_output_;
  ShardedParameters shards_;
};

/// accelerate's fp32-output conversion (`convert_outputs_to_fp32`), as a module level (`module`)
/// so it can be recognised: outputs come back as float32. The wrapped run differs from the
/// inner module's by design (`Numerics::kChangesOutput`).
class Fp32OutputWrapperImpl final : public WrapperImpl {
 public:
  explicit Fp32OutputWrapperImpl(ModulePtr inner);

 protected:
  torch::Tensor run(const torch::Tensor& input) override;
};

struct FsdpOptions {
  /// `use_orig_params=False`: the wrapper owns one flat parameter (`_flat_param`) and the inner
  /// modules' parameters leave their registries (keys show the flat parameter, not the
  /// originals); a forward through the wrapper runs them on views of it.
  bool flat_parameters = false;
  /// `FULL_SHARD` (with `flat_parameters`): `_flat_param` is this rank's rows of the flat tensor
  /// (padded to a multiple of the world size of `ProcessGroup::current()`), all-gathered before
  /// each forward and freed after, its gradient reduce-scattered.
  bool sharded = false;
  /// `MixedPrecision(param_dtype=..., reduce_dtype=float32)` (with `sharded`): the forward and
  /// backward run in this dtype on a cast of the gathered parameters, the input cast to it and
  /// the output cast back; shards stay in the model's dtype, gradients are reduced in float32.
  std::optional<c10::ScalarType> compute_dtype;
};

/// `torch.distributed.fsdp.FullyShardedDataParallel` (`_fsdp_wrapped_module`). With flat
/// parameters it covers the parameters of its subtree except those under a nested
/// `FullyShardedDataParallel`; the inner modules must read parameters through their registry
/// (`wrapcert::Layer`s and the fixtures do; LibTorch's `Linear` reads a member and does not).
class FullyShardedDataParallelImpl final : public WrapperImpl, public ShardedModule {
 public:
  explicit FullyShardedDataParallelImpl(ModulePtr inner, FsdpOptions options = {});

  /// The real `FullyShardedDataParallel.module`: the wrapped module, skipping a
  /// `CheckpointWrapper` directly under it.
  ModulePtr module() const;

  /// Holds a flat parameter now (flat mode, not yet released).
  bool flat() const { return flat_.holding(); }
  /// Gives every inner module its original parameters back, the very tensors it had, holding
  /// the flat parameter's current values; drops the flat parameter. Afterwards the wrapper
  /// passes calls through. Returns the inner module. A no-op without a flat parameter. Sharded,
  /// a collective: the shards are gathered first.
  ModulePtr release();

  /// Sharded: this rank's part of each original parameter (empty otherwise).
  std::vector<LocalShard> local_shards() const override;
  std::vector<std::pair<std::string, torch::Tensor>> full_state_dict(int root) override;

 protected:
  torch::Tensor run(const torch::Tensor& input) override;

 private:
  FsdpOptions options_;
  FlatParameters flat_;
  std::shared_ptr<ProcessGroup> group_;  // sharded: the ranks
  RowShard shard_;
  torch::Tensor whole_;  // sharded: the originals' storage (they are views of it)
};

}  // namespace wrapcert
