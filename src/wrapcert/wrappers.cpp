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
  return call(*inner(), input);
}

namespace {
template <typename Tag>
WrapperKind builtin_kind() {
  return wrapper_kind<detail::BuiltinWrapperImpl<Tag>>(Tag::kName, Tag::kSlot);
}
}  // namespace

void register_builtin_wrappers(Registry& registry) {
  registry.add(builtin_kind<detail::DataParallelTag>());
  registry.add(builtin_kind<detail::DistributedDataParallelTag>());
  auto fsdp = builtin_kind<detail::FullyShardedDataParallelTag>();
  fsdp.aliases = {"module"};        // FullyShardedDataParallel.module property
  fsdp.forwards_attributes = true;  // and __getattr__ falls through to the wrapped module
  registry.add(std::move(fsdp));
  auto fsdp_v2 = builtin_kind<detail::SpmdFullyShardedDataParallelTag>();
  fsdp_v2.aliases = {"module"};  // torch_xla: `module` is a property aliasing `_orig_module`
  registry.add(std::move(fsdp_v2));
  auto compiled = builtin_kind<detail::OptimizedModuleTag>();
  compiled.forwards_attributes = true;  // OptimizedModule.__getattr__ falls through to _orig_mod
  registry.add(std::move(compiled));
  auto checkpoint = builtin_kind<detail::CheckpointWrapperTag>();
  checkpoint.forwards_attributes = true;  // ActivationWrapper.__getattr__ does the same
  registry.add(std::move(checkpoint));
  auto deepspeed = builtin_kind<detail::DeepSpeedEngineTag>();
  deepspeed.forwards_attributes = true;  // DeepSpeedEngine.__getattr__ looks in self.module
  registry.add(std::move(deepspeed));
}

}  // namespace wrapcert
