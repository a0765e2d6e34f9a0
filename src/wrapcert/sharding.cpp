#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/error.h>
#include <wrapcert/process_group.h>
#include <wrapcert/sharding.h>

#include <torch/autograd.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

/// The tensors some `ShardedParameters` holds now, process-wide: a tensor tied across units
/// stays with the unit that took it first.
struct Held {
  std::mutex mutex;
  std::unordered_set<const void*> impls;
};
Held& held() {
  static auto* h = new Held;  // never destroyed: used from destructors
  return *h;
}

/// The all-gather with a reduce-scatter for backward. The group travels as an address in the
/// context (an `IValue` holds no `shared_ptr` of ours); the caller keeps it alive through
/// backward, as a wrapper keeps its group.
struct GatherRowsFunction : torch::autograd::Function<GatherRowsFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& local,
                               int64_t rows, int64_t group_address, int64_t reduction,
                               int64_t reduce_dtype) {
    auto* group = reinterpret_cast<ProcessGroup*>(group_address);
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["reduce_dtype"] = reduce_dtype;
    return torch::cat(group->all_gather(local.detach().contiguous())).narrow(0, 0, rows);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const auto rows = ctx->saved_data["rows"].toInt();
    const auto reduce_dtype = ctx->saved_data["reduce_dtype"].toInt();
    const auto grad = grads[0];
    const auto chunk = (rows + group->size() - 1) / group->size();
    auto sizes = grad.sizes().vec();
    sizes[0] = chunk * group->size();
    auto padded = torch::zeros(sizes, grad.options());
    padded.narrow(0, 0, rows).copy_(grad);
    if (reduce_dtype >= 0) padded = padded.to(static_cast<c10::ScalarType>(reduce_dtype));
    auto local = group->reduce_scatter_sum(padded);
    if (ctx->saved_data["reduction"].toInt() == static_cast<int64_t>(GradientReduction::kMean)) {
      local.div_(group->size());
    }
    return {local.to(grad.scalar_type()), {}, {}, {}, {}};
  }
};

std::string join(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

}  // namespace

RowShard RowShard::of(int64_t rows, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorCode::kInvalidArgument, "",
                "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(size));
  }
  return RowShard{rows, (rows + size - 1) / size, rank, size};
}

int64_t RowShard::begin() const {
  return std::min(rows, chunk * rank);
}

int64_t RowShard::end() const {
  return std::min(rows, chunk * (rank + 1));
}

torch::Tensor take_rows(const torch::Tensor& full, const RowShard& shard) {
  auto sizes = full.sizes().vec();
  sizes[0] = shard.chunk;
  auto local = torch::zeros(sizes, full.options().requires_grad(false));
  const auto n = shard.end() - shard.begin();
  if (n > 0) local.narrow(0, 0, n).copy_(full.detach().narrow(0, shard.begin(), n));
  return local;
}

torch::Tensor gather_rows(const torch::Tensor& local, const RowShard& shard,
                          const std::shared_ptr<ProcessGroup>& group, GatherOptions options) {
  return GatherRowsFunction::apply(
      local, shard.rows, reinterpret_cast<int64_t>(group.get()),
      static_cast<int64_t>(options.reduction),
      options.reduce_dtype ? static_cast<int64_t>(*options.reduce_dtype) : int64_t{-1});
}

torch::Tensor gather_rows_detached(const torch::Tensor& local, const RowShard& shard,
                                   ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  return torch::cat(group.all_gather(local.detach().contiguous())).narrow(0, 0, shard.rows);
}

std::vector<std::pair<const torch::nn::Module*, std::string>> module_paths(
    const torch::nn::Module& holder) {
  std::vector<std::pair<const torch::nn::Module*, std::string>> out;
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<std::pair<const torch::nn::Module*, std::string>> stack{{&holder, ""}};
  while (!stack.empty()) {
    auto [m, path] = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    out.emplace_back(m, path);
    const auto& children = detail::child_table(*m);
    for (size_t i = children.size(); i-- > 0;) {
      stack.emplace_back(children[i].value().get(), join(path, children[i].key()));
    }
  }
  return out;
}

ScopedBufferCast::ScopedBufferCast(const torch::nn::Module& root, c10::ScalarType dtype,
                                   const std::function<bool(const torch::nn::Module&)>& skip) {
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<const torch::nn::Module*> stack{&root};
  while (!stack.empty()) {
    const auto* m = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    // LibTorch keeps the table protected; the entry is replaced in place and put back.
    auto& table = const_cast<detail::TensorTable&>(detail::buffer_table(*m));
    for (auto& item : table) {
      if (!item.value().defined() || !item.value().is_floating_point()) continue;
      saved_.push_back(Saved{m, item.key(), item.value()});
      item.value() = item.value().to(dtype);
    }
    for (const auto& child : detail::child_table(*m)) {
      if (!skip || !skip(*child.value())) stack.push_back(child.value().get());
    }
  }
}

ScopedBufferCast::~ScopedBufferCast() {
  for (auto& s : saved_) {
    auto& table = const_cast<detail::TensorTable&>(detail::buffer_table(*s.module));
    if (auto* entry = table.find(s.name)) *entry = s.original;
  }
}

ShardedParameters::~ShardedParameters() {
  forget();
}

void ShardedParameters::forget() {
  auto& h = held();
  const std::lock_guard<std::mutex> lock(h.mutex);
  for (const auto& piece : pieces_) h.impls.erase(piece.original.unsafeGetTensorImpl());
}

void ShardedParameters::take(const std::shared_ptr<torch::nn::Module>& inner,
                             std::shared_ptr<ProcessGroup> group, GatherOptions options,
                             const std::function<bool(const torch::nn::Module&)>& skip) {
  if (holding()) throw Error(ErrorCode::kInvalidArgument, "", "already holds sharded parameters");
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<std::shared_ptr<torch::nn::Module>> stack{inner};
  while (!stack.empty()) {
    auto m = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(m.get()).second) continue;
    modules.push_back(m);
    const auto children = m->named_children();
    for (size_t i = children.size(); i-- > 0;) {
      if (!skip || !skip(*children[i].value())) stack.push_back(children[i].value());
    }
  }
  std::unordered_map<const void*, torch::Tensor> locals;  // a tied tensor is sharded once
  std::vector<Piece> pieces;
  for (const auto& m : modules) {
    const auto* kind = Registry::global().find(*m);
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      const auto& t = p.value();
      if (!t.defined() || t.dim() == 0) continue;
      if (kind && kind->owns(p.key())) continue;
      const auto* impl = t.unsafeGetTensorImpl();
      {
        auto& h = held();
        const std::lock_guard<std::mutex> lock(h.mutex);
        if (h.impls.count(impl) != 0) continue;
      }
      const auto shard = RowShard::of(t.size(0), group->rank(), group->size());
      auto [it, fresh] = locals.emplace(impl, torch::Tensor());
      if (fresh) it->second = take_rows(t, shard).set_requires_grad(t.requires_grad());
      pieces.push_back(Piece{m, p.key(), t, it->second, shard});
    }
  }
  for (const auto& piece : pieces) detail::insert_parameter(*piece.owner, piece.name, piece.local);
  group_ = std::move(group);
  options_ = options;
  pieces_ = std::move(pieces);
  auto& h = held();
  const std::lock_guard<std::mutex> lock(h.mutex);
  for (const auto& piece : pieces_) h.impls.insert(piece.original.unsafeGetTensorImpl());
}

ShardedParameters::Unsharded ShardedParameters::unshard(
    std::optional<c10::ScalarType> compute_dtype) {
  if (!holding()) return Unsharded(nullptr);
  std::unordered_map<const void*, torch::Tensor> whole;  // a tied tensor is gathered once
  for (const auto& piece : pieces_) {
    auto [it, fresh] = whole.emplace(piece.local.unsafeGetTensorImpl(), torch::Tensor());
    if (fresh) {
      it->second = gather_rows(piece.local, piece.shard, group_, options_);
      if (compute_dtype) it->second = it->second.to(*compute_dtype);
    }
  }
  for (const auto& piece : pieces_) {
    detail::insert_parameter(*piece.owner, piece.name, whole.at(piece.local.unsafeGetTensorImpl()));
  }
  return Unsharded(&pieces_);
}

ShardedParameters::Unsharded::~Unsharded() {
  if (!pieces_) return;
  for (const auto& piece : *pieces_) {
    detail::insert_parameter(*piece.owner, piece.name, piece.local);
  }
}

std::vector<LocalShard> ShardedParameters::local_shards(const torch::nn::Module& holder) const {
  std::unordered_map<const torch::nn::Module*, std::string> paths;
  for (const auto& [m, path] : module_paths(holder)) paths.emplace(m, path);
  std::vector<LocalShard> out;
  for (const auto& piece : pieces_) {
    const auto it = paths.find(piece.owner.get());
    if (it == paths.end()) continue;
    const auto row = piece.original.numel() / std::max<int64_t>(piece.shard.rows, 1);
    const auto n = (piece.shard.end() - piece.shard.begin()) * row;
    LocalShard s;
    s.key = join(it->second, piece.name);
    s.values = piece.local.detach().reshape(-1).narrow(0, 0, n);
    if (piece.local.grad().defined()) s.grad = piece.local.grad().reshape(-1).narrow(0, 0, n);
    s.offset = piece.shard.begin() * row;
    s.shape = piece.original.sizes().vec();
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> ShardedParameters::full_state_dict(
    const torch::nn::Module& holder, int root) {
  std::unordered_map<const torch::nn::Module*, std::string> paths;
  for (const auto& [m, path] : module_paths(holder)) paths.emplace(m, path);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_map<const void*, torch::Tensor> whole;
  for (const auto& piece : pieces_) {
    auto [it, fresh] = whole.emplace(piece.local.unsafeGetTensorImpl(), torch::Tensor());
    if (fresh) it->second = gather_rows_detached(piece.local, piece.shard, *group_);
    const auto path = paths.find(piece.owner.get());
    if (group_->rank() == root && path != paths.end()) {
      out.emplace_back(join(path->second, piece.name), it->second.clone());
    }
  }
  return out;
}

void ShardedParameters::restore() {
  if (!holding()) return;
  std::unordered_set<const void*> done;
  for (const auto& piece : pieces_) {
    if (done.insert(piece.local.unsafeGetTensorImpl()).second) {
      const auto whole = gather_rows_detached(piece.local, piece.shard, *group_);
      torch::NoGradGuard no_grad;
      piece.original.copy_(whole);
    }
  }
  for (const auto& piece : pieces_) {
    detail::insert_parameter(*piece.owner, piece.name, piece.original);
  }
  forget();
  pieces_.clear();
  group_.reset();
}

}  // namespace wrapcert
