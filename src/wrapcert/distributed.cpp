#include <wrapcert/distributed.h>
#include <wrapcert/error.h>

#include <atomic>
#include <unordered_set>

namespace wrapcert {

struct DistributedDataParallelImpl::Reducer {
  std::shared_ptr<ProcessGroup> group;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks;  // parameter, hook index
  std::atomic<std::int64_t> pending{0};  // gradients still to reduce in this backward
  std::atomic<std::int64_t> reductions{0};
  bool installed = false;
};

DistributedDataParallelImpl::DistributedDataParallelImpl(ModulePtr inner,
                                                         std::shared_ptr<ProcessGroup> group)
    : WrapperImpl("DistributedDataParallel", "module", std::move(inner)),
      group_(group ? std::move(group) : ProcessGroup::current()),
      reducer_(std::make_shared<Reducer>()) {
  reducer_->group = group_;
}

void DistributedDataParallelImpl::install_hooks() {
  // Installed on the first forward through the wrapper rather than at construction, so that
  // building deep stacks of wrappers stays linear; hooks only matter after a DDP forward.
  std::unordered_set<const void*> seen;  // a tied parameter is reduced once
  for (auto& param : inner()->parameters(/*recurse=*/true)) {
    if (!param.defined() || !param.requires_grad() ||
        !seen.insert(param.unsafeGetTensorImpl()).second) {
      continue;
    }
    std::weak_ptr<Reducer> weak = reducer_;
    const unsigned index = param.register_hook([weak](torch::Tensor grad) -> torch::Tensor {
      auto reducer = weak.lock();
      if (!reducer || reducer->pending.load() <= 0) return grad;  // not after a DDP forward
      auto reduced = grad.clone();
      reducer->group->all_reduce_sum(reduced);
      reduced.div_(reducer->group->size());
      --reducer->pending;
      ++reducer->reductions;
      return reduced;
    });
    reducer_->hooks.emplace_back(param, index);
  }
  reducer_->installed = true;
}

DistributedDataParallelImpl::~DistributedDataParallelImpl() {
  for (auto& [param, index] : reducer_->hooks) param.remove_hook(index);
}

std::int64_t DistributedDataParallelImpl::reductions() const {
  return reducer_->reductions;
}

torch::Tensor DistributedDataParallelImpl::run(const torch::Tensor& input) {
  if (!reducer_->installed) install_hooks();
  reducer_->pending = static_cast<std::int64_t>(reducer_->hooks.size());
  return call(*inner(), input);
}

WrapperKind distributed_data_parallel_kind() {
  auto kind = wrapper_kind<DistributedDataParallelImpl>("DistributedDataParallel", "module");
  kind.ranks.certify = true;
  kind.ranks.nests = false;  // torch's DDP wraps the whole model once
  return kind;
}

}  // namespace wrapcert
