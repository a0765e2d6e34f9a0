#pragma once
/// The `DistributedDataParallel` wrapper, over a real c10d process group (`process_group.h`):
/// it averages gradients across ranks after backward, as the real one does.
///
///   wrapcert::ProcessGroup::set_default(wrapcert::ProcessGroup::join(*rendezvous));
///   auto ddp = std::make_shared<wrapcert::DistributedDataParallelImpl>(model);
///   wrapcert::call(*ddp, x).sum().backward();   // grads are now the average over ranks

#include <wrapcert/process_group.h>
#include <wrapcert/wrappers.h>

#include <cstdint>
#include <memory>
#include <string>

namespace wrapcert {

/// `torch.nn.parallel.DistributedDataParallel` (`module`). A forward through the wrapper arms a
/// gradient hook on every parameter of the inner module (installed on the first forward); in the
/// backward that follows, each gradient is all-reduced and divided by the world size. A run of the
/// inner module alone is not reduced (the real reducer only acts after a DDP forward).
class DistributedDataParallelImpl final : public WrapperImpl {
 public:
  /// Without a group, uses `ProcessGroup::current()`.
  explicit DistributedDataParallelImpl(ModulePtr inner,
                                       std::shared_ptr<ProcessGroup> group = nullptr);
  ~DistributedDataParallelImpl() override;

  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  /// Gradients all-reduced so far.
  std::int64_t reductions() const;

 protected:
  torch::Tensor run(const torch::Tensor& input) override;

 private:
  struct Reducer;
  void install_hooks();
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<Reducer> reducer_;
};

/// The registry descriptor of `DistributedDataParallelImpl`.
WrapperKind distributed_data_parallel_kind();

}  // namespace wrapcert
