#include <wrapcert/distributed.h>
#include <wrapcert/error.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <unordered_set>

namespace wrapcert {

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::string owned_store_file;  // removed on destruction when this process created it
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  const auto file = impl_->owned_store_file;
  impl_.reset();
  if (!file.empty()) std::remove(file.c_str());
}

std::shared_ptr<ProcessGroup> ProcessGroup::gloo(const std::string& store_path, int rank,
                                                 int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(
        ErrorCode::kInvalidArgument, "",
        "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world_size));
  }
  auto impl = std::make_unique<Impl>();
  impl->store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, rank, world_size, options);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

std::shared_ptr<ProcessGroup> ProcessGroup::single_process() {
  // One group per process. A forked child (certification runs each check in one) inherits the
  // parent's group without the threads that serve it, so an all-reduce there would wait
  // forever: the child makes its own, and leaves the parent's alone (destroying it would wait
  // for those threads too).
  static std::mutex mutex;
  static pid_t owner = 0;
  static std::shared_ptr<ProcessGroup> group;
  const std::lock_guard<std::mutex> lock(mutex);
  if (owner != ::getpid()) {
    if (group) new std::shared_ptr<ProcessGroup>(std::move(group));  // the parent's: never freed
    const auto path =
        std::filesystem::temp_directory_path() / ("wrapcert-store-" + std::to_string(::getpid()));
    std::filesystem::remove(path);  // a stale file from an earlier process with this pid
    group = gloo(path.string(), 0, 1);
    // One rank has nothing more to agree on: the store's file is not needed after joining, and
    // a child that ends with _exit would leave it behind.
    std::filesystem::remove(path);
    owner = ::getpid();
  }
  return group;
}

int ProcessGroup::rank() const {
  return impl_->group->getRank();
}
int ProcessGroup::size() const {
  return impl_->group->getSize();
}

void ProcessGroup::all_reduce_sum(torch::Tensor& tensor) {
  if (tensor.scalar_type() == torch::kBFloat16) {
    // Gloo in LibTorch 1.13 reduces no bfloat16: summed in float32 and rounded once (one rank's
    // gradient comes back bit for bit).
    std::vector<torch::Tensor> wide{tensor.to(torch::kFloat)};
    impl_->group->allreduce(wide)->wait();
    tensor.copy_(wide[0]);
    return;
  }
  std::vector<torch::Tensor> tensors{tensor};
  impl_->group->allreduce(tensors)->wait();
}

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
      group_(group ? std::move(group) : ProcessGroup::single_process()),
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
  return wrapper_kind<DistributedDataParallelImpl>("DistributedDataParallel", "module");
}

}  // namespace wrapcert
