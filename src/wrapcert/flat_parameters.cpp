#include <wrapcert/detail/marks.h>
#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/error.h>
#include <wrapcert/flat_parameters.h>
#include <wrapcert/layer.h>
#include <wrapcert/registry.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

/// The parameters some `FlatParameters` holds now, process-wide: a parameter another unit holds
/// (tied across units) stays with that unit.
struct Taken {
  std::mutex mutex;
  std::unordered_set<const void*> impls;
};
Taken& taken() {
  static auto* t = new Taken;  // never destroyed: used from destructors
  return *t;
}

/// Whether another unit holds the parameter `impl` now.
bool held_elsewhere(const void* impl) {
  auto& t = taken();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.impls.count(impl) != 0;
}

}  // namespace

FlatParameters::~FlatParameters() {
  forget();
}

void FlatParameters::forget() {
  auto& t = taken();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (const auto& piece : pieces_) t.impls.erase(piece.original.unsafeGetTensorImpl());
}

void FlatParameters::take(torch::nn::Module& holder, std::string name,
                          const std::shared_ptr<torch::nn::Module>& inner,
                          const std::function<bool(const torch::nn::Module&)>& skip) {
  if (holding()) {
    throw Error(ErrorCode::kInvalidArgument, name, "already holds flat parameters");
  }
  // The subtree's modules, each once, in pre-order.
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
  std::unordered_map<const void*, int64_t> offsets;  // a tied parameter is stored once
  std::vector<torch::Tensor> parts;
  std::vector<Piece> pieces;
  int64_t size = 0;
  for (const auto& m : modules) {
    std::vector<std::pair<std::string, torch::Tensor>> held;
    const auto* kind = Registry::global().find(*m);
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      if (!p.value().defined()) continue;
      if (kind && kind->owns(p.key())) continue;  // a nested wrapper's own (flat) state
      const auto& t = p.value();
      // Tied to a parameter another unit holds: it stays with that unit, and this module keeps
      // it registered (its values are that unit's; its gradient is its own plus that unit's).
      if (held_elsewhere(t.unsafeGetTensorImpl())) continue;
      if (!parts.empty() && (t.scalar_type() != parts.front().scalar_type() ||
                             t.device() != parts.front().device())) {
        throw Error(ErrorCode::kInvalidArgument, p.key(),
                    "flat parameters need one dtype and device for the whole subtree");
      }
      auto [it, fresh] = offsets.emplace(t.unsafeGetTensorImpl(), size);
      if (fresh) {
        parts.push_back(t.detach().reshape(-1));
        size += t.numel();
      }
      pieces.push_back(Piece{m, p.key(), t, it->second});
      held.emplace_back(p.key(), t);
    }
    if (held.empty()) continue;
    for (const auto& [param, tensor] : held) detail::erase_parameter(*m, param);
    detail::hold_parameters(m, std::move(held));
  }
  if (pieces.empty()) return;
  // Frozen parameters stay frozen: the flat tensor needs a gradient only when some piece does,
  // and a forward runs frozen pieces on detached views (no gradient reaches their part of it), as
  // FSDP's `use_orig_params=True` leaves them out of the optimizer.
  const bool trains = std::any_of(pieces.begin(), pieces.end(),
                                  [](const Piece& p) { return p.original.requires_grad(); });
  auto flat = holder.register_parameter(name, torch::cat(parts), trains);
  // The originals now alias the flat storage, so their values follow it and restoring is exact.
  torch::NoGradGuard no_grad;
  for (auto& piece : pieces) {
    piece.original.set_data(
        flat.detach().narrow(0, piece.offset, piece.original.numel()).view(piece.original.sizes()));
  }
  holder_ = &holder;
  name_ = std::move(name);
  numel_ = flat.numel();
  pieces_ = std::move(pieces);
  auto& t = taken();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (const auto& piece : pieces_) t.impls.insert(piece.original.unsafeGetTensorImpl());
}

torch::Tensor FlatParameters::flat() const {
  if (!holding()) return {};
  return holder_->named_parameters(/*recurse=*/false)[name_];
}

FlatParameters::Unsharded FlatParameters::unshard() {
  if (!holding()) return Unsharded(nullptr);
  return unshard(flat());
}

FlatParameters::Unsharded FlatParameters::unshard(const torch::Tensor& whole) {
  if (!holding()) return Unsharded(nullptr);
  for (const auto& piece : pieces_) {
    auto view = whole.narrow(0, piece.offset, piece.original.numel()).view(piece.original.sizes());
    detail::insert_parameter(*piece.owner, piece.name,
                             piece.original.requires_grad() ? view : view.detach());
  }
  return Unsharded(&pieces_);
}

FlatParameters::Unsharded::~Unsharded() {
  if (!pieces_) return;
  for (const auto& piece : *pieces_) detail::erase_parameter(*piece.owner, piece.name);
}

void FlatParameters::restore() {
  if (!holding()) return;
  for (const auto& piece : pieces_) {
    detail::insert_parameter(*piece.owner, piece.name, piece.original);
    detail::drop_held_parameters(*piece.owner);
  }
  detail::erase_parameter(*holder_, name_);
  forget();
  pieces_.clear();
  holder_ = nullptr;
  numel_ = 0;
}

}  // namespace wrapcert
