#pragma once
/// Data parallelism over a real c10d process group (Gloo), and the `DistributedDataParallel`
/// wrapper that averages gradients across ranks after backward, as the real one does.
///
///   auto group = wrapcert::ProcessGroup::gloo("/tmp/store", rank, world_size);
///   auto ddp = std::make_shared<wrapcert::DistributedDataParallelImpl>(model, group);
///   wrapcert::call(*ddp, x).sum().backward();   // grads are now the average over ranks

#include <wrapcert/wrappers.h>

#include <memory>
#include <string>

namespace wrapcert {

/// A c10d process group, opaque here so that this header does not pull in c10d and Gloo.
class ProcessGroup {
 public:
  /// Gloo over a `c10d::FileStore` at `store_path` (all ranks use the same path), bound to the
  /// loopback interface. Blocks until all `world_size` ranks have joined.
  static std::shared_ptr<ProcessGroup> gloo(const std::string& store_path, int rank,
                                            int world_size);
  /// A world-size-1 Gloo group of this process, created on first use.
  static std::shared_ptr<ProcessGroup> single_process();

  int rank() const;
  int size() const;
  /// Sums `tensor` over all ranks, in place (blocking).
  void all_reduce_sum(torch::Tensor& tensor);

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  ~ProcessGroup();

 private:
  std::unique_ptr<Impl> impl_;
};

/// `torch.nn.parallel.DistributedDataParallel` (`module`). A forward through the wrapper arms a
/// gradient hook on every parameter of the inner module (installed on the first forward); in the
/// backward that follows, each gradient is all-reduced and divided by the world size. A run of the
/// inner module alone is not reduced (the real reducer only acts after a DDP forward).
class DistributedDataParallelImpl final : public WrapperImpl {
 public:
  /// Without a group, uses `ProcessGroup::single_process()`.
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
