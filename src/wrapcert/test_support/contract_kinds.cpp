#include <wrapcert/flat_parameters.h>
#include <wrapcert/test_support/contract_kinds.h>
#include <wrapcert/wrappers.h>

#include <torch/nn/modules/linear.h>

namespace wrapcert::test_support {
namespace {

constexpr const char* kSlot = "_contract_module";

/// A pass-through of its own type per kind name.
template <int N>
class RelayImpl final : public WrapperImpl {
 public:
  explicit RelayImpl(ModulePtr inner) : WrapperImpl(name(), kSlot, std::move(inner)) {}
  static const char* name();
};

template <>
const char* RelayImpl<0>::name() {
  return "AliasedRelay";
}
template <>
const char* RelayImpl<1>::name() {
  return "CopyingRelease";
}
template <>
const char* RelayImpl<2>::name() {
  return "EmptyingRelease";
}

class StepCounterImpl final : public WrapperImpl {
 public:
  explicit StepCounterImpl(ModulePtr inner) : WrapperImpl("StepCounter", kSlot, std::move(inner)) {
    register_buffer("_step", torch::zeros({}, torch::kLong));
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    named_buffers(/*recurse=*/false)["_step"].add_(1);
    return call(*inner(), input);
  }
};

class SecondRegistrationImpl final : public WrapperImpl {
 public:
  explicit SecondRegistrationImpl(ModulePtr inner)
      : WrapperImpl("SecondRegistration", kSlot, inner) {
    register_module("_shadow", std::move(inner));  // e.g. a "reference copy" that is no copy
  }
};

class MisdirectedAliasImpl final : public WrapperImpl {
 public:
  explicit MisdirectedAliasImpl(ModulePtr inner)
      : WrapperImpl("MisdirectedAlias", kSlot, std::move(inner)) {
    register_module("_stats", std::make_shared<torch::nn::IdentityImpl>());
  }
};

/// What a flat kind gets wrong, if anything.
enum class FlatFault { kNone, kSwappedRelease, kSwappedForward, kDetachedViews, kStaleGather };

/// Flat parameters through the public API, with one fault at most.
template <FlatFault Fault>
class FlatShardImpl final : public WrapperImpl {
 public:
  explicit FlatShardImpl(ModulePtr inner) : WrapperImpl(name(), kSlot, std::move(inner)) {
    flat_.take(*this, "_flat", this->inner());
    if (Fault == FlatFault::kStaleGather && flat_.holding())
      gathered_ = flat_.flat().detach().clone();
  }
  static const char* name() {
    switch (Fault) {
      case FlatFault::kNone:
        return "FlatShard";
      case FlatFault::kSwappedRelease:
        return "SwappedFlatRelease";
      case FlatFault::kSwappedForward:
        return "SwappedFlatForward";
      case FlatFault::kDetachedViews:
        return "DetachedFlatViews";
      case FlatFault::kStaleGather:
        return "StaleGather";
    }
    return "";
  }

  ModulePtr release() {
    const auto pieces = flat_.pieces();  // restore() forgets them
    flat_.restore();
    if (Fault == FlatFault::kSwappedRelease)
      swap_first_pair(pieces, [](const auto& p) { return p.original; });
    return inner();
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (Fault == FlatFault::kStaleGather && flat_.holding()) {
      // The values gathered when it was made, whatever the optimizer did since; the gradient
      // still reaches the flat parameter, so one call alone cannot tell.
      const auto flat = flat_.flat();
      const auto unsharded = flat_.unshard(gathered_ + (flat - flat.detach()));
      return call(*inner(), input);
    }
    const auto unsharded = flat_.unshard();
    auto current = [](const FlatParameters::Piece& p) {
      return p.owner->named_parameters(/*recurse=*/false)[p.name];
    };
    if (Fault == FlatFault::kSwappedForward) swap_first_pair(flat_.pieces(), current);
    if (Fault == FlatFault::kDetachedViews) {
      // Runs on the flat parameter's values, out of autograd's sight: no gradient reaches it.
      for (const auto& p : flat_.pieces()) tie_parameter(*p.owner, p.name, current(p).detach());
    }
    return call(*inner(), input);
  }

 private:
  /// Puts the first two pieces of one shape (not one tensor) in each other's place.
  template <typename Get>
  static void swap_first_pair(const std::vector<FlatParameters::Piece>& pieces, Get get) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      for (size_t j = i + 1; j < pieces.size(); ++j) {
        const auto& a = pieces[i];
        const auto& b = pieces[j];
        if (a.original.sizes() == b.original.sizes() && a.offset != b.offset) {
          const auto ta = get(a);
          const auto tb = get(b);
          tie_parameter(*a.owner, a.name, tb);
          tie_parameter(*b.owner, b.name, ta);
          return;
        }
      }
    }
  }

  FlatParameters flat_;
  torch::Tensor gathered_;
};

template <FlatFault Fault>
WrapperKind flat_kind() {
  using Impl = FlatShardImpl<Fault>;
  auto kind = wrapper_kind<Impl>(Impl::name(), kSlot);
  kind.owned_state = {"_flat"};
  kind.numerics = Numerics::kNeedsRelease;
  kind.release = [](torch::nn::Module& wrapper) { return dynamic_cast<Impl&>(wrapper).release(); };
  return kind;
}

/// A pass-through with a mode (`Kind[fused]`); `FusedFault`: the mode scales outputs by
/// 1 + 2^-6, as a fused kernel with a wrong constant would.
template <bool FusedFault>
class ModalImpl final : public WrapperImpl {
 public:
  explicit ModalImpl(ModulePtr inner, bool fused = false)
      : WrapperImpl(name(), kSlot, std::move(inner)), fused_(fused) {}
  static const char* name() { return FusedFault ? "ModalFault" : "ModalRelay"; }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    auto out = call(*inner(), input);
    return FusedFault && fused_ ? out * (1.0 + 1.0 / 64) : out;
  }

 private:
  bool fused_;
};

template <bool FusedFault>
WrapperKind modal_kind() {
  using Impl = ModalImpl<FusedFault>;
  auto kind = wrapper_kind<Impl>(Impl::name(), kSlot);
  kind.modes.push_back(WrapperMode{
      "fused", [](ModulePtr inner) -> ModulePtr { return std::make_shared<Impl>(inner, true); },
      Numerics::kBitwise});
  return kind;
}

/// Rounds a float32 input through bfloat16 (a "fast path" for float32 alone); exact in double.
class Float32RoundingImpl final : public WrapperImpl {
 public:
  explicit Float32RoundingImpl(ModulePtr inner)
      : WrapperImpl("Float32Rounding", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (input.scalar_type() == torch::kFloat) {
      return call(*inner(), input.to(torch::kBFloat16).to(torch::kFloat));
    }
    return call(*inner(), input);
  }
};

/// In eval mode runs the inner module without autograd, as if eval meant inference.
class EvalNoGradImpl final : public WrapperImpl {
 public:
  explicit EvalNoGradImpl(ModulePtr inner) : WrapperImpl("EvalNoGrad", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (is_training()) return call(*inner(), input);
    torch::NoGradGuard no_grad;
    return call(*inner(), input);
  }
};

/// Sets `requires_grad` on every parameter it wraps: what fine-tuning froze trains again.
class UnfreezingImpl final : public WrapperImpl {
 public:
  explicit UnfreezingImpl(ModulePtr inner) : WrapperImpl("Unfreezing", kSlot, inner) {
    for (auto& p : inner->parameters(/*recurse=*/true)) p.set_requires_grad(true);
  }
};

/// `eval()` reaches the wrapper and not the module it wraps (its `train` is its own).
class StuckInTrainingImpl final : public WrapperImpl {
 public:
  explicit StuckInTrainingImpl(ModulePtr inner)
      : WrapperImpl("StuckInTraining", kSlot, std::move(inner)) {}
  void train(bool on) override {
    WrapperImpl::train(on);
    inner()->train(true);
  }
};

/// Forwards `train()` and `eval()` to the module it wraps by hand, then to itself: correct.
class ForwardingTrainImpl final : public WrapperImpl {
 public:
  explicit ForwardingTrainImpl(ModulePtr inner)
      : WrapperImpl("ForwardingTrain", kSlot, std::move(inner)) {}
  void train(bool on) override {
    inner()->train(on);
    WrapperImpl::train(on);
  }
};

/// Keeps a clone of the module it wraps where LibTorch can clone it: the model's own tensors are
/// no longer what it trains and saves.
class CloneKeepingImpl final : public WrapperImpl {
 public:
  explicit CloneKeepingImpl(ModulePtr inner)
      : WrapperImpl("CloneKeeping", kSlot, cloned(std::move(inner))) {}

 private:
  static ModulePtr cloned(ModulePtr inner) {
    try {
      return inner->clone();
    } catch (const std::exception&) {
      return inner;  // not cloneable: wrapcert's own modules
    }
  }
};

/// Doubles its output for a batch of three or more examples.
class LargeBatchFaultImpl final : public WrapperImpl {
 public:
  explicit LargeBatchFaultImpl(ModulePtr inner)
      : WrapperImpl("LargeBatchFault", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    const auto out = call(*inner(), input);
    return input.size(0) >= 3 ? out * 2 : out;
  }
};

/// Under `torch.no_grad()` scales its output, as a wrong inference fast path would.
class NoGradScaleImpl final : public WrapperImpl {
 public:
  explicit NoGradScaleImpl(ModulePtr inner) : WrapperImpl("NoGradScale", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    const auto out = call(*inner(), input);
    return torch::GradMode::is_enabled() ? out : out * 2;
  }
};

/// Under `torch.no_grad()` takes a path of its own that computes the same: correct.
class ExactNoGradImpl final : public WrapperImpl {
 public:
  explicit ExactNoGradImpl(ModulePtr inner) : WrapperImpl("ExactNoGrad", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (torch::GradMode::is_enabled()) return call(*inner(), input);
    return call(*inner(), input.detach()).contiguous();
  }
};

/// Holds a gain of its own (declared) whose gradient it leaves twice as long as the gain: every
/// forward and backward agrees with the model's, and any optimizer step raises.
class OptimizerBreakingImpl final : public WrapperImpl {
 public:
  explicit OptimizerBreakingImpl(ModulePtr inner)
      : WrapperImpl("OptimizerBreaking", kSlot, std::move(inner)) {
    register_parameter("_gain", torch::ones({1}, torch::kDouble));
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    auto gain = named_parameters(/*recurse=*/false)["_gain"];
    gain.mutable_grad() = torch::zeros({2}, gain.options());  // backward adds to it: still [2]
    const auto out = call(*inner(), input);
    return out + (gain.sum() - gain.sum().detach()).to(out.scalar_type());
  }
};

/// Holds a parameter of its own called `weight`: what the module in its slot's `weight`
/// translates to.
class CollidingStateImpl final : public WrapperImpl {
 public:
  explicit CollidingStateImpl(ModulePtr inner)
      : WrapperImpl("CollidingState", kSlot, std::move(inner)) {
    register_parameter("weight", torch::ones({1}));
  }
};

/// Keeps a statistic of its inputs in a tensor it does not register (LibTorch 1.13's form of a
/// non-persistent buffer): in no state dict, so nothing to declare; each mode's `make` builds it.
class InputStatsImpl final : public WrapperImpl {
 public:
  explicit InputStatsImpl(ModulePtr inner)
      : WrapperImpl("InputStats", kSlot, std::move(inner)), seen_(torch::zeros({})) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    {
      torch::NoGradGuard no_grad;
      seen_ += input.to(torch::kDouble).abs().sum();
    }
    return call(*inner(), input);
  }

 private:
  torch::Tensor seen_;
};

/// Keeps its first output and returns it on every later call.
class CachedOutputImpl final : public WrapperImpl {
 public:
  explicit CachedOutputImpl(ModulePtr inner)
      : WrapperImpl("CachedOutput", kSlot, std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (!cache_.defined()) cache_ = call(*inner(), input);
    return cache_;
  }

 private:
  torch::Tensor cache_;
};

}  // namespace

WrapperKind step_counter_kind() {
  auto kind = wrapper_kind<StepCounterImpl>("StepCounter", kSlot);
  kind.owned_state = {"_step"};
  return kind;
}

WrapperKind aliased_relay_kind() {
  auto kind = wrapper_kind<RelayImpl<0>>(RelayImpl<0>::name(), kSlot);
  kind.aliases = {"module"};
  return kind;
}

WrapperKind flat_shard_kind() {
  return flat_kind<FlatFault::kNone>();
}

WrapperKind stale_gather_kind() {
  return flat_kind<FlatFault::kStaleGather>();
}

WrapperKind unfreezing_kind() {
  return wrapper_kind<UnfreezingImpl>("Unfreezing", kSlot);
}

WrapperKind stuck_in_training_kind() {
  return wrapper_kind<StuckInTrainingImpl>("StuckInTraining", kSlot);
}

WrapperKind forwarding_train_kind() {
  return wrapper_kind<ForwardingTrainImpl>("ForwardingTrain", kSlot);
}

WrapperKind clone_keeping_kind() {
  return wrapper_kind<CloneKeepingImpl>("CloneKeeping", kSlot);
}

WrapperKind large_batch_fault_kind() {
  return wrapper_kind<LargeBatchFaultImpl>("LargeBatchFault", kSlot);
}

WrapperKind no_grad_scale_kind() {
  return wrapper_kind<NoGradScaleImpl>("NoGradScale", kSlot);
}

WrapperKind optimizer_breaking_kind() {
  auto kind = wrapper_kind<OptimizerBreakingImpl>("OptimizerBreaking", kSlot);
  kind.owned_state = {"_gain"};
  return kind;
}

WrapperKind exact_no_grad_kind() {
  return wrapper_kind<ExactNoGradImpl>("ExactNoGrad", kSlot);
}

WrapperKind input_stats_kind() {
  auto kind = wrapper_kind<InputStatsImpl>("InputStats", kSlot);
  kind.modes.push_back(WrapperMode{
      "tracked",
      [](ModulePtr inner) -> ModulePtr { return std::make_shared<InputStatsImpl>(inner); },
      Numerics::kBitwise});
  return kind;
}

WrapperKind modal_relay_kind() {
  return modal_kind<false>();
}

WrapperKind copying_release_kind() {
  auto kind = wrapper_kind<RelayImpl<1>>(RelayImpl<1>::name(), kSlot);
  kind.release = [](torch::nn::Module& wrapper) {
    auto inner = dynamic_cast<WrapperImpl&>(wrapper).inner();
    for (const auto& m : inner->modules()) {
      for (const auto& p : m->named_parameters(/*recurse=*/false)) {
        if (p.value().defined()) tie_parameter(*m, p.key(), p.value().detach().clone());
      }
    }
    return inner;
  };
  return kind;
}

WrapperKind emptying_release_kind() {
  auto kind = wrapper_kind<RelayImpl<2>>(RelayImpl<2>::name(), kSlot);
  kind.release = [](torch::nn::Module& wrapper) {
    auto inner = dynamic_cast<WrapperImpl&>(wrapper).inner();
    wrapper.unregister_module(kSlot);
    return inner;
  };
  return kind;
}

WrapperKind swapped_flat_release_kind() {
  return flat_kind<FlatFault::kSwappedRelease>();
}

WrapperKind swapped_flat_forward_kind() {
  return flat_kind<FlatFault::kSwappedForward>();
}

WrapperKind detached_flat_views_kind() {
  return flat_kind<FlatFault::kDetachedViews>();
}

WrapperKind float32_rounding_kind() {
  return wrapper_kind<Float32RoundingImpl>("Float32Rounding", kSlot);
}

WrapperKind eval_no_grad_kind() {
  return wrapper_kind<EvalNoGradImpl>("EvalNoGrad", kSlot);
}

WrapperKind modal_fault_kind() {
  return modal_kind<true>();
}

WrapperKind colliding_state_kind() {
  auto kind = wrapper_kind<CollidingStateImpl>("CollidingState", kSlot);
  kind.owned_state = {"weight"};
  return kind;
}

WrapperKind cached_output_kind() {
  return wrapper_kind<CachedOutputImpl>("CachedOutput", kSlot);
}

WrapperKind second_registration_kind() {
  auto kind = wrapper_kind<SecondRegistrationImpl>("SecondRegistration", kSlot);
  kind.owned_state = {"_shadow"};
  return kind;
}

WrapperKind misdirected_alias_kind() {
  auto kind = wrapper_kind<MisdirectedAliasImpl>("MisdirectedAlias", kSlot);
  kind.aliases = {"module"};
  kind.owned_state = {"_stats"};
  kind.alias_target = [](const torch::nn::Module& wrapper, const std::string&) {
    return wrapper.named_children()["_stats"];
  };
  return kind;
}

}  // namespace wrapcert::test_support
