#include <wrapcert/detail/marks.h>
#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/process_group.h>
#include <wrapcert/wrappers.h>

#include <algorithm>
#include <unordered_map>

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

SpmdFullyShardedDataParallelImpl::SpmdFullyShardedDataParallelImpl(ModulePtr inner,
                                                                   SpmdOptions options)
    : SpmdFullyShardedDataParallelImpl(std::move(inner), ShardOutput()) {
  if (options.sharded) {
    // A nested SpmdFullyShardedDataParallel shards its own subtree.
    shards_.take(this->inner(), ProcessGroup::current(), {}, [](const torch::nn::Module& m) {
      return dynamic_cast<const SpmdFullyShardedDataParallelImpl*>(&m) != nullptr;
    });
  }
}

torch::Tensor SpmdFullyShardedDataParallelImpl::run(const torch::Tensor& input) {
  const auto unsharded = shards_.unshard();
  auto output = call(*inner(), input);
  if (shard_output_) shard_output_(output);
  return output;
}

ModulePtr SpmdFullyShardedDataParallelImpl::release() {
  shards_.restore();
  return inner();
}

std::vector<LocalShard> SpmdFullyShardedDataParallelImpl::local_shards() const {
  return shards_.local_shards(*this);
}

std::vector<std::pair<std::string, torch::Tensor>>
SpmdFullyShardedDataParallelImpl::full_state_dict(int root) {
  return shards_.full_state_dict(*this, root);
}

Fp32OutputWrapperImpl::Fp32OutputWrapperImpl(ModulePtr inner)
    : WrapperImpl("Fp32OutputWrapper", "module", std::move(inner)) {}

torch::Tensor Fp32OutputWrapperImpl::run(const torch::Tensor& input) {
  return call(*inner(), input).to(torch::kFloat);
}

FullyShardedDataParallelImpl::FullyShardedDataParallelImpl(ModulePtr inner, FsdpOptions options)
    : WrapperImpl("FullyShardedDataParallel", "_fsdp_wrapped_module", std::move(inner)),
      options_(options) {
  if (options.flat_parameters || options.sharded) {
    // A nested FullyShardedDataParallel flattens its own subtree.
    flat_.take(*this, "_flat_param", this->inner(), [](const torch::nn::Module& m) {
      return dynamic_cast<const FullyShardedDataParallelImpl*>(&m) != nullptr;
    });
  }
  if (options.sharded && flat_.holding()) {
    // The originals stay views of the whole flat tensor (what release gives back); the
    // registered `_flat_param` becomes this rank's rows of it, padded.
    group_ = ProcessGroup::current();
    whole_ = flat_.flat().detach();
    shard_ = RowShard::of(whole_.size(0), group_->rank(), group_->size());
    auto local = take_rows(whole_, shard_).set_requires_grad(flat_.flat().requires_grad());
    detail::insert_parameter(*this, "_flat_param", local);
  }
}

ModulePtr FullyShardedDataParallelImpl::release() {
  if (group_ && flat_.holding()) {
    const auto gathered = gather_rows_detached(flat_.flat(), shard_, *group_);
    torch::NoGradGuard no_grad;
    whole_.copy_(gathered);
  }
  flat_.restore();
  whole_ = torch::Tensor();
  return inner();
}

torch::Tensor FullyShardedDataParallelImpl::run(const torch::Tensor& input) {
  // Mixed precision: the inputs cast, the outputs cast back, whether or not this unit holds
  // parameters of its own.
  const auto compute = options_.compute_dtype;
  auto inner_call = [&] {
    if (!compute) return call(*inner(), input);
    // `MixedPrecision(param_dtype, buffer_dtype)`: this unit's buffers computed with in the same
    // dtype for this forward (a nested unit casts its own), floating-point inputs cast, outputs
    // cast back.
    const ScopedBufferCast buffers(*inner(), *compute, [](const torch::nn::Module& m) {
      return dynamic_cast<const FullyShardedDataParallelImpl*>(&m) != nullptr;
    });
    if (!input.is_floating_point()) return call(*inner(), input);
    auto output = call(*inner(), input.to(*compute));
    return output.is_floating_point() ? output.to(input.scalar_type()) : output;
  };
  if (group_ && flat_.holding()) {
    // All-gather the shards; views of the whole tensor (cast for mixed precision) stand in for
    // the originals during this forward; the gradient is reduce-scattered to the shard.
    GatherOptions gather;
    if (compute) gather.reduce_dtype = torch::kFloat;
    auto whole = gather_rows(flat_.flat(), shard_, group_, gather);
    if (compute) whole = whole.to(*compute);
    const auto unsharded = flat_.unshard(whole);
    return inner_call();
  }
  // Unshard: views of the flat parameter stand in for the originals during this forward, so
  // gradients reach the flat parameter; reshard afterwards, also on an exception.
  const auto unsharded = flat_.unshard();
  return inner_call();
}

std::vector<LocalShard> FullyShardedDataParallelImpl::local_shards() const {
  std::vector<LocalShard> out;
  if (!group_ || !flat_.holding()) return out;
  std::unordered_map<const torch::nn::Module*, std::string> paths;
  for (const auto& [m, path] : module_paths(*this)) paths.emplace(m, path);
  const auto local = flat_.flat();
  for (const auto& piece : flat_.pieces()) {
    const auto begin = std::max(piece.offset, shard_.begin());
    const auto end = std::min(piece.offset + piece.original.numel(), shard_.end());
    const auto it = paths.find(piece.owner.get());
    if (begin >= end || it == paths.end()) continue;
    LocalShard s;
    s.key = (it->second.empty() ? "" : it->second + ".") + piece.name;
    s.values = local.detach().narrow(0, begin - shard_.begin(), end - begin);
    if (local.grad().defined())
      s.grad = local.grad().narrow(0, begin - shard_.begin(), end - begin);
    s.offset = begin - piece.offset;
    s.shape = piece.original.sizes().vec();
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallelImpl::full_state_dict(
    int root) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!group_ || !flat_.holding()) return out;
  const auto whole = gather_rows_detached(flat_.flat(), shard_, *group_);
  if (group_->rank() != root) return out;
  std::unordered_map<const torch::nn::Module*, std::string> paths;
  for (const auto& [m, path] : module_paths(*this)) paths.emplace(m, path);
  for (const auto& piece : flat_.pieces()) {
    const auto it = paths.find(piece.owner.get());
    if (it == paths.end()) continue;
    out.emplace_back(
        (it->second.empty() ? "" : it->second + ".") + piece.name,
        whole.narrow(0, piece.offset, piece.original.numel()).view(piece.original.sizes()).clone());
  }
  return out;
}

ModulePtr FullyShardedDataParallelImpl::module() const {
  auto wrapped = inner();
  if (auto checkpoint = std::dynamic_pointer_cast<CheckpointWrapperImpl>(wrapped)) {
    return checkpoint->inner();
  }
  return wrapped;
}

}  // namespace wrapcert
