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

/// Flat parameters through the public API; `Swapped` puts two back in each other's place.
template <bool Swapped>
class FlatShardImpl final : public WrapperImpl {
 public:
  explicit FlatShardImpl(ModulePtr inner)
      : WrapperImpl(Swapped ? "SwappedFlatRelease" : "FlatShard", kSlot, std::move(inner)) {
    flat_.take(*this, "_flat", this->inner());
  }

  ModulePtr release() {
    const auto pieces = flat_.pieces();  // restore() forgets them
    flat_.restore();
    if (Swapped) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        for (size_t j = i + 1; j < pieces.size(); ++j) {
          const auto& a = pieces[i];
          const auto& b = pieces[j];
          if (a.original.sizes() == b.original.sizes() && !a.original.is_same(b.original)) {
            tie_parameter(*a.owner, a.name, b.original);
            tie_parameter(*b.owner, b.name, a.original);
            return inner();
          }
        }
      }
    }
    return inner();
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    const auto unsharded = flat_.unshard();
    return call(*inner(), input);
  }

 private:
  FlatParameters flat_;
};

template <bool Swapped>
WrapperKind flat_kind(const char* name) {
  auto kind = wrapper_kind<FlatShardImpl<Swapped>>(name, kSlot);
  kind.owned_state = {"_flat"};
  kind.numerics = Numerics::kNeedsRelease;
  kind.release = [](torch::nn::Module& wrapper) {
    return dynamic_cast<FlatShardImpl<Swapped>&>(wrapper).release();
  };
  return kind;
}

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
  return flat_kind<false>("FlatShard");
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
  return flat_kind<true>("SwappedFlatRelease");
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
