#pragma once
/// The built-in wrapper kinds: one C++ type per real wrapper, each storing the inner module under
/// the real wrapper's slot name, so keys look exactly like the real ones.
///
///   auto wrapped = std::make_shared<wrapcert::SpmdFullyShardedDataParallelImpl>(model);
///   wrapped->forward(x);   // runs model through the wrapper; wrapped->calls() == 1
///
/// For now each kind passes the call through and counts it; gradient all-reduce, flat
/// parameters and recomputation belong to the wrapper zoo.

#include <wrapcert/layer.h>
#include <wrapcert/registry.h>

#include <cstdint>
#include <string>

namespace wrapcert {

/// Base of wrappers: registers the inner module at `slot`, forwards to whatever module the
/// slot holds now, and counts calls so tests can prove a run went through it.
class WrapperImpl : public Layer {
 public:
  WrapperImpl(std::string kind_name, std::string slot, ModulePtr inner);

  torch::Tensor forward(const torch::Tensor& input) override;

  /// The module at the slot; throws `Error` (kEmptySlot) when there is none.
  ModulePtr inner() const;
  const std::string& slot() const { return slot_; }
  const std::string& kind_name() const { return kind_name_; }

  std::int64_t calls() const { return calls_; }
  void reset_calls() { calls_ = 0; }

  std::string python_name() const override { return kind_name_; }

 private:
  std::string kind_name_;
  std::string slot_;
  std::int64_t calls_ = 0;
};

namespace detail {
/// One distinct C++ type per built-in kind, so that recognition by type tells them apart.
template <typename Tag>
class BuiltinWrapperImpl final : public WrapperImpl {
 public:
  explicit BuiltinWrapperImpl(ModulePtr inner)
      : WrapperImpl(Tag::kName, Tag::kSlot, std::move(inner)) {}
};

// clang-format off
struct DataParallelTag { static constexpr const char* kName = "DataParallel"; static constexpr const char* kSlot = "module"; };
struct DistributedDataParallelTag { static constexpr const char* kName = "DistributedDataParallel"; static constexpr const char* kSlot = "module"; };
struct FullyShardedDataParallelTag { static constexpr const char* kName = "FullyShardedDataParallel"; static constexpr const char* kSlot = "_fsdp_wrapped_module"; };
struct SpmdFullyShardedDataParallelTag { static constexpr const char* kName = "SpmdFullyShardedDataParallel"; static constexpr const char* kSlot = "_orig_module"; };
struct OptimizedModuleTag { static constexpr const char* kName = "OptimizedModule"; static constexpr const char* kSlot = "_orig_mod"; };
struct CheckpointWrapperTag { static constexpr const char* kName = "CheckpointWrapper"; static constexpr const char* kSlot = "_checkpoint_wrapped_module"; };
struct DeepSpeedEngineTag { static constexpr const char* kName = "DeepSpeedEngine"; static constexpr const char* kSlot = "module"; };
// clang-format on
}  // namespace detail

/// `torch.nn.DataParallel` (`module`).
using DataParallelImpl = detail::BuiltinWrapperImpl<detail::DataParallelTag>;
/// `torch.nn.parallel.DistributedDataParallel` (`module`).
using DistributedDataParallelImpl = detail::BuiltinWrapperImpl<detail::DistributedDataParallelTag>;
/// `torch.distributed.fsdp.FullyShardedDataParallel` (`_fsdp_wrapped_module`).
using FullyShardedDataParallelImpl =
    detail::BuiltinWrapperImpl<detail::FullyShardedDataParallelTag>;
/// torch_xla's `SpmdFullyShardedDataParallel` (`_orig_module`, alias `module`).
using SpmdFullyShardedDataParallelImpl =
    detail::BuiltinWrapperImpl<detail::SpmdFullyShardedDataParallelTag>;
/// What `torch.compile` returns (`_orig_mod`; forwards attribute access).
using OptimizedModuleImpl = detail::BuiltinWrapperImpl<detail::OptimizedModuleTag>;
/// torch's activation `CheckpointWrapper` (`_checkpoint_wrapped_module`).
using CheckpointWrapperImpl = detail::BuiltinWrapperImpl<detail::CheckpointWrapperTag>;
/// DeepSpeed's engine (`module`).
using DeepSpeedEngineImpl = detail::BuiltinWrapperImpl<detail::DeepSpeedEngineTag>;

/// Adds the built-in kinds to `registry`.
void register_builtin_wrappers(Registry& registry);

}  // namespace wrapcert
