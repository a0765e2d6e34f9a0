// Kinds that shard across ranks, for the tests of `wrapcert certify --world-size` (a plugin, so
// that every rank the launcher starts loads them too): correct ones built on the public sharding
// API (`ShardedParameters`, `gather_rows`), and faulty ones, one fault each.
//
//   ShardRows            correct: each parameter's rows sharded, gradients averaged
//   ShardRowsSum         correct: declares a summing reduction, and sums
//   MixedShardRows       correct: bfloat16 compute, float32 reduction
//   OffByOneShard        rank 1's shard starts one row late (and says so)
//   AveragingShard       declares a summing reduction, averages
//   PaddingDropped       shards of rows / world size rows: the last rows are nobody's
//   GatherToWrongRank    the full state dict gathered to rank 1
//   MixedBf16Reduce      bfloat16 compute, reduced in bfloat16
//   KillsRank1           rank 1 kills itself in its third forward (inside a collective)
//   HangsRank1           rank 1 never returns from its third forward
//   SkipsEmptyShard      a rank that holds no row of a parameter skips its gather (computing
//                        with zeros): the others wait for it in a collective it never enters
//   ExtraOnRank1         rank 1 enters an all-reduce of its own in its third forward
//   GatheredOnce         gathers the whole parameters at wrap time and computes with them
//                        ever after: right until an optimizer steps the shards
#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/plugin.h>
#include <wrapcert/process_group.h>
#include <wrapcert/sharding.h>
#include <wrapcert/wrappers.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <unordered_map>

namespace {

using wrapcert::GatherOptions;
using wrapcert::GradientReduction;
using wrapcert::LocalShard;
using wrapcert::ModulePtr;
using wrapcert::ProcessGroup;
using wrapcert::RowShard;

enum class Fault {
  kNone,
  kSum,
  kMixed,
  kOffByOne,
  kAverages,
  kDropsPadding,
  kWrongRank,
  kMixedBf16Reduce,
  kKill,
  kHang,
  kRankOneState,
  kReleaseAddsOnRank1,
  kGatheredOnce,
  kSkipsEmptyShard,
  kExtraOnRank1
};

constexpr const char* kSlot = "_sharded_module";

template <Fault F>
const char* name_of() {
  switch (F) {
    case Fault::kNone:
      return "ShardRows";
    case Fault::kSum:
      return "ShardRowsSum";
    case Fault::kMixed:
      return "MixedShardRows";
    case Fault::kOffByOne:
      return "OffByOneShard";
    case Fault::kAverages:
      return "AveragingShard";
    case Fault::kDropsPadding:
      return "PaddingDropped";
    case Fault::kWrongRank:
      return "GatherToWrongRank";
    case Fault::kMixedBf16Reduce:
      return "MixedBf16Reduce";
    case Fault::kKill:
      return "KillsRank1";
    case Fault::kHang:
      return "HangsRank1";
    case Fault::kRankOneState:
      return "StateOnRank1";
    case Fault::kReleaseAddsOnRank1:
      return "ReleaseAddsOnRank1";
    case Fault::kGatheredOnce:
      return "GatheredOnce";
    case Fault::kSkipsEmptyShard:
      return "SkipsEmptyShard";
    case Fault::kExtraOnRank1:
      return "ExtraOnRank1";
  }
  return "";
}

constexpr bool mixed_compute(Fault f) {
  return f == Fault::kMixed || f == Fault::kMixedBf16Reduce;
}

/// Faults of the shard layout, by hand: the rows rank `r` holds.
struct Layout {
  int64_t chunk, begin, held;
};
Layout layout(Fault f, int64_t rows, int rank, int size) {
  const auto shard = RowShard::of(rows, rank, size);
  if (f == Fault::kDropsPadding) {
    const auto chunk = std::max<int64_t>(rows / size, 1);
    const auto begin = std::min(rows, chunk * rank);
    return {chunk, begin, std::min(chunk, rows - begin)};
  }
  auto begin = shard.begin();
  if (f == Fault::kOffByOne && rank == 1) begin = std::min(rows, begin + 1);
  return {shard.chunk, begin, std::min(shard.chunk, rows - begin)};
}

template <Fault F>
class FaultShardImpl final : public wrapcert::WrapperImpl, public wrapcert::ShardedModule {
 public:
  explicit FaultShardImpl(ModulePtr inner)
      : WrapperImpl(name_of<F>(), kSlot, std::move(inner)), group_(ProcessGroup::current()) {
    auto skip = [](const torch::nn::Module& m) {
      return dynamic_cast<const FaultShardImpl*>(&m) != nullptr;
    };
    if (hand_made()) {
      take_by_hand(skip);
      return;
    }
    GatherOptions options;
    if (F == Fault::kSum) options.reduction = GradientReduction::kSum;
    if (F == Fault::kMixed) options.reduce_dtype = torch::kFloat;
    if (F == Fault::kMixedBf16Reduce) options.reduce_dtype = torch::kBFloat16;
    shards_.take(this->inner(), group_, options, skip);
    // Declared state that rank 1 alone saves: each rank's checkpoint has other keys.
    if (F == Fault::kRankOneState && group_->rank() == 1) {
      register_buffer("_step", torch::zeros({}, torch::kLong));
    }
  }

  ModulePtr release() {
    if (hand_made()) {
      for (auto& p : pieces_) {
        const auto whole = gather(p, /*grad=*/false);
        torch::NoGradGuard no_grad;
        p.original.copy_(whole);
        set(p, p.original);
      }
      pieces_.clear();
      return inner();
    }
    shards_.restore();
    // A buffer rank 1 alone adds as it releases: its released checkpoint has a key more.
    if (F == Fault::kReleaseAddsOnRank1 && group_->rank() == 1) {
      register_buffer("_released", torch::ones({1}));
    }
    return inner();
  }

  std::vector<LocalShard> local_shards() const override {
    if (!hand_made()) return shards_.local_shards(*this);
    std::unordered_map<const torch::nn::Module*, std::string> paths;
    for (const auto& [m, path] : wrapcert::module_paths(*this)) paths.emplace(m, path);
    std::vector<LocalShard> out;
    for (const auto& p : pieces_) {
      const auto row = p.original.numel() / p.original.size(0);
      LocalShard s;
      s.key = paths.at(p.owner.get()) + "." + p.name;
      s.values = p.local.detach().reshape(-1).narrow(0, 0, p.layout.held * row);
      if (p.local.grad().defined()) {
        s.grad = p.local.grad().reshape(-1).narrow(0, 0, p.layout.held * row);
      }
      s.offset = p.layout.begin * row;
      s.shape = p.original.sizes().vec();
      out.push_back(std::move(s));
    }
    return out;
  }

  std::vector<std::pair<std::string, torch::Tensor>> full_state_dict(int root) override {
    if (F == Fault::kWrongRank) root = (root + 1) % group_->size();
    if (!hand_made()) return shards_.full_state_dict(*this, root);
    return {};
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    static int forwards = 0;  // in this process, across the cases
    if (group_->rank() == 1 && ++forwards == 3) {
      if (F == Fault::kKill) ::kill(::getpid(), SIGKILL);
      if (F == Fault::kHang) {
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      if (F == Fault::kExtraOnRank1) {
        auto flag = torch::ones({1}, torch::kDouble);
        group_->all_reduce_sum(flag);
      }
    }
    if (hand_made()) {
      for (auto& p : pieces_) set(p, gather(p, /*grad=*/true));
      struct Back {
        FaultShardImpl& self;
        ~Back() {
          for (auto& p : self.pieces_) self.set(p, p.local);
        }
      } back{*this};
      return wrapcert::call(*inner(), input);
    }
    if (F == Fault::kGatheredOnce) return gathered_once(input);
    if (F == Fault::kSkipsEmptyShard) return skipping_empty(input);
    if (!mixed_compute(F)) {
      const auto unsharded = shards_.unshard();
      return wrapcert::call(*inner(), input);
    }
    const auto unsharded = shards_.unshard(torch::kBFloat16);
    const wrapcert::ScopedBufferCast buffers(*inner(), torch::kBFloat16, [](const auto& m) {
      return dynamic_cast<const FaultShardImpl*>(&m) != nullptr;
    });
    if (!input.is_floating_point()) return wrapcert::call(*inner(), input);
    return wrapcert::call(*inner(), input.to(torch::kBFloat16)).to(input.scalar_type());
  }

 private:
  struct Piece {
    ModulePtr owner;
    std::string name;
    torch::Tensor original, local;
    Layout layout;
  };

  static constexpr bool hand_made() { return F == Fault::kOffByOne || F == Fault::kDropsPadding; }

  /// `inner` run with `whole[i]` where piece i's shard is registered, the shards back after.
  torch::Tensor run_with(const std::vector<torch::Tensor>& whole, const torch::Tensor& input) {
    struct Back {
      FaultShardImpl& self;
      ~Back() {
        for (const auto& p : self.shards_.pieces())
          wrapcert::detail::insert_parameter(*p.owner, p.name, p.local);
      }
    } back{*this};
    for (size_t i = 0; i < shards_.pieces().size(); ++i) {
      const auto& p = shards_.pieces()[i];
      wrapcert::detail::insert_parameter(*p.owner, p.name, whole[i]);
    }
    return wrapcert::call(*inner(), input);
  }

  /// The usual gather, except on a rank that holds none of a parameter's rows.
  torch::Tensor skipping_empty(const torch::Tensor& input) {
    std::vector<torch::Tensor> whole;
    for (const auto& p : shards_.pieces()) {
      const bool empty = p.shard.begin() >= p.shard.end();
      whole.push_back(empty ? torch::zeros_like(p.original)
                            : wrapcert::gather_rows(p.local, p.shard, group_));
    }
    return run_with(whole, input);
  }

  /// The whole parameters as they were at the first forward, kept: each forward puts them where
  /// the shards are registered and routes their gradient to the shards (the reduction right), so
  /// one forward and backward are right, and every one after a step computes with stale values.
  torch::Tensor gathered_once(const torch::Tensor& input) {
    if (stale_.empty()) {
      const auto unsharded = shards_.unshard();
      for (const auto& p : shards_.pieces()) {
        stale_.push_back(p.owner->named_parameters(/*recurse=*/false)[p.name].detach().clone());
      }
    }
    std::vector<torch::Tensor> whole;
    for (size_t i = 0; i < shards_.pieces().size(); ++i) {
      const auto& p = shards_.pieces()[i];
      // The stale values, with the gradient of a fresh gather (which reduces it to the shard).
      const auto fresh = wrapcert::gather_rows(p.local, p.shard, group_);
      whole.push_back(fresh - fresh.detach() + stale_[i]);
    }
    return run_with(whole, input);
  }

  void take_by_hand(const std::function<bool(const torch::nn::Module&)>& skip) {
    std::vector<ModulePtr> stack{inner()};
    while (!stack.empty()) {
      auto m = stack.back();
      stack.pop_back();
      for (const auto& p : m->named_parameters(/*recurse=*/false)) {
        if (!p.value().defined() || p.value().dim() == 0) continue;
        const auto rows = p.value().size(0);
        const auto l = layout(F, rows, group_->rank(), group_->size());
        auto sizes = p.value().sizes().vec();
        sizes[0] = l.chunk;
        auto local = torch::zeros(sizes, p.value().options().requires_grad(false));
        if (l.held > 0)
          local.narrow(0, 0, l.held).copy_(p.value().detach().narrow(0, l.begin, l.held));
        local.set_requires_grad(true);
        pieces_.push_back(Piece{m, p.key(), p.value(), local, l});
      }
      for (const auto& child : m->children()) {
        if (!skip(*child)) stack.push_back(child);
      }
    }
    for (auto& p : pieces_) set(p, p.local);
  }

  /// The usual gather, over the layout as this kind shards it.
  torch::Tensor gather(const Piece& p, bool grad) {
    const RowShard shard{p.original.size(0), p.layout.chunk, group_->rank(), group_->size()};
    if (grad) return wrapcert::gather_rows(p.local, shard, group_);
    return wrapcert::gather_rows_detached(p.local, shard, *group_);
  }

  static void set(const Piece& p, const torch::Tensor& t) {
    wrapcert::detail::insert_parameter(*p.owner, p.name, t);
  }

  std::shared_ptr<ProcessGroup> group_;
  wrapcert::ShardedParameters shards_;
  std::vector<Piece> pieces_;
  std::vector<torch::Tensor> stale_;  ///< GatheredOnce's whole parameters, as first gathered
};

template <Fault F>
wrapcert::WrapperKind kind(bool sums = false,
                           std::optional<c10::ScalarType> compute = std::nullopt) {
  auto k = wrapcert::wrapper_kind<FaultShardImpl<F>>(name_of<F>(), kSlot);
  k.numerics = wrapcert::Numerics::kBitwise;
  k.release = [](torch::nn::Module& wrapper) {
    return dynamic_cast<FaultShardImpl<F>&>(wrapper).release();
  };
  k.ranks.certify = true;
  if (sums) k.ranks.reduction = GradientReduction::kSum;
  k.ranks.compute_dtype = compute;
  if (F == Fault::kRankOneState) k.owned_state = {"_step"};
  return k;
}

}  // namespace

WRAPCERT_PLUGIN(registry) {
  registry.add(kind<Fault::kNone>());
  registry.add(kind<Fault::kSum>(/*sums=*/true));
  registry.add(kind<Fault::kMixed>(false, torch::kBFloat16));
  registry.add(kind<Fault::kOffByOne>());
  registry.add(kind<Fault::kAverages>(/*sums=*/true));
  registry.add(kind<Fault::kDropsPadding>());
  registry.add(kind<Fault::kWrongRank>());
  registry.add(kind<Fault::kMixedBf16Reduce>(false, torch::kBFloat16));
  registry.add(kind<Fault::kKill>());
  registry.add(kind<Fault::kHang>());
  registry.add(kind<Fault::kRankOneState>());
  registry.add(kind<Fault::kReleaseAddsOnRank1>());
  registry.add(kind<Fault::kGatheredOnce>());
  registry.add(kind<Fault::kSkipsEmptyShard>());
  registry.add(kind<Fault::kExtraOnRank1>());
}
