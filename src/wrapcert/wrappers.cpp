#include <wrapcert/detail/marks.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
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

}  // namespace wrapcert
