#include <wrapcert/checkpoint.h>
#include <wrapcert/detail/marks.h>
#include <wrapcert/distributed.h>
#include <wrapcert/error.h>
#include <wrapcert/wrappers.h>

namespace wrapcert {

WrapperImpl::WrapperImpl(std::string kind_name, std::string slot, ModulePtr inner)
    : Layer("wrapcert::" + kind_name), kind_name_(std::move(kind_name)), slot_(std::move(slot)) {
  if (!inner) {
    throw Error(ErrorCode::kEmptySlot, slot_, kind_name_ + " needs a module to wrap");
  }
  register_module(slot_, std::move(inner));
}

ModulePtr WrapperImpl::inner() const {
  auto child = find_child(*this, slot_);
  if (!child) {
    throw Error(ErrorCode::kEmptySlot, slot_, kind_name_ + " has no module in its slot");
  }
  return child;
}

torch::Tensor WrapperImpl::forward(const torch::Tensor& input) {
  ++calls_;
  return run(input);
}

torch::Tensor WrapperImpl::run(const torch::Tensor& input) {
  return call(*inner(), input);
}

CheckpointWrapperImpl::CheckpointWrapperImpl(ModulePtr inner)
    : WrapperImpl("CheckpointWrapper", "_checkpoint_wrapped_module", std::move(inner)) {}

torch::Tensor CheckpointWrapperImpl::run(const torch::Tensor& input) {
  return checkpointed_call(*inner(), input);
}

SpmdFullyShardedDataParallelImpl::SpmdFullyShardedDataParallelImpl(ModulePtr inner,
                                                                   ShardOutput shard_output)
    : WrapperImpl("SpmdFullyShardedDataParallel", "_orig_module", std::move(inner)),
      shard_output_(std::move(shard_output)) {}

torch::Tensor SpmdFullyShardedDataParallelImpl::run(const torch::Tensor& input) {
  auto output = call(*inner(), input);
  if (shard_output_) shard_output_(output);
  return output;
}

Fp32OutputWrapperImpl::Fp32OutputWrapperImpl(ModulePtr inner)
    : WrapperImpl("Fp32OutputWrapper", "module", std::move(inner)) {}

torch::Tensor Fp32OutputWrapperImpl::run(const torch::Tensor& input) {
  return call(*inner(), input).to(torch::kFloat);
}

FullyShardedDataParallelImpl::FullyShardedDataParallelImpl(ModulePtr inner, FsdpOptions options)
    : WrapperImpl("FullyShardedDataParallel", "_fsdp_wrapped_module", std::move(inner)) {
  if (options.flat_parameters) {
    // A nested FullyShardedDataParallel flattens its own subtree.
    flat_.take(*this, "_flat_param", this->inner(), [](const torch::nn::Module& m) {
      return dynamic_cast<const FullyShardedDataParallelImpl*>(&m) != nullptr;
    });
  }
}

ModulePtr FullyShardedDataParallelImpl::release() {
  flat_.restore();
  return inner();
}

torch::Tensor FullyShardedDataParallelImpl::run(const torch::Tensor& input) {
  // Unshard: views of the flat parameter stand in for the originals during this forward, so
  // gradients reach the flat parameter; reshard afterwards, also on an exception.
  const auto unsharded = flat_.unshard();
  return call(*inner(), input);
}

ModulePtr FullyShardedDataParallelImpl::module() const {
  auto wrapped = inner();
  if (auto checkpoint = std::dynamic_pointer_cast<CheckpointWrapperImpl>(wrapped)) {
    return checkpoint->inner();
  }
  return wrapped;
}

namespace {
template <typename Tag>
WrapperKind pass_through_kind() {
  return wrapper_kind<detail::PassThroughWrapperImpl<Tag>>(Tag::kName, Tag::kSlot);
}
}  // namespace

void register_builtin_wrappers(Registry& registry) {
  registry.add(pass_through_kind<detail::DataParallelTag>());
  registry.add(distributed_data_parallel_kind());
  auto fsdp = wrapper_kind<FullyShardedDataParallelImpl>("FullyShardedDataParallel",
                                                         "_fsdp_wrapped_module");
  fsdp.aliases = {"module"};           // FullyShardedDataParallel.module property
  fsdp.forwards_attributes = true;     // and __getattr__ falls through to the wrapped module
  fsdp.owned_state = {"_flat_param"};  // in flat mode
  fsdp.release = [](torch::nn::Module& wrapper) {
    return dynamic_cast<FullyShardedDataParallelImpl&>(wrapper).release();
  };
  // `use_orig_params=False`: one flat parameter per wrapper, the originals back on release.
  FsdpOptions flat;
  flat.flat_parameters = true;
  fsdp.modes.push_back(WrapperMode{"flat",
                                   [flat](ModulePtr inner) -> ModulePtr {
                                     return std::make_shared<FullyShardedDataParallelImpl>(
                                         std::move(inner), flat);
                                   },
                                   Numerics::kNeedsRelease});
  registry.add(std::move(fsdp));
  auto fsdp_v2 = wrapper_kind<SpmdFullyShardedDataParallelImpl>("SpmdFullyShardedDataParallel",
                                                                "_orig_module");
  fsdp_v2.aliases = {"module"};  // torch_xla: `module` is a property aliasing `_orig_module`
  fsdp_v2.forwards_attributes = true;
  registry.add(std::move(fsdp_v2));
  auto compiled = pass_through_kind<detail::OptimizedModuleTag>();
  compiled.forwards_attributes = true;  // OptimizedModule.__getattr__ falls through to _orig_mod
  registry.add(std::move(compiled));
  auto checkpoint =
      wrapper_kind<CheckpointWrapperImpl>("CheckpointWrapper", "_checkpoint_wrapped_module");
  checkpoint.forwards_attributes = true;    // ActivationWrapper.__getattr__ does the same
  checkpoint.state_dict_hides_slot = true;  // its _post_state_dict_hook strips the prefix
  // Recomputation sums an input's gradient contributions in another order when the input is
  // also used outside the checkpointed module (a + (b + c) for (a + b) + c).
  checkpoint.numerics = Numerics::kTolerance;
  checkpoint.tolerance = 1e-10;
  registry.add(std::move(checkpoint));
  auto deepspeed = pass_through_kind<detail::DeepSpeedEngineTag>();
  deepspeed.forwards_attributes = true;  // DeepSpeedEngine.__getattr__ looks in self.module
  registry.add(std::move(deepspeed));
  auto fp32 = wrapper_kind<Fp32OutputWrapperImpl>("Fp32OutputWrapper", "module");
  fp32.numerics = Numerics::kChangesOutput;
  registry.add(std::move(fp32));
}

}  // namespace wrapcert
