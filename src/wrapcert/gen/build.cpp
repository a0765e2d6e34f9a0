#include <wrapcert/detail/blame.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/layer.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/wrap.h>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

namespace wrapcert::gen {
namespace {

/// Embedding leaves take token ids; derive them from the float input.
torch::Tensor ids_from(const torch::Tensor& x, int64_t dim) {
  return (x.detach().abs() * 1000).to(torch::kLong).remainder(dim).select(-1, 0);
}

/// A custom module: each child (or each element of a child list or dict) gets the input, and
/// the outputs are summed onto it. Children are reached by name, lists through their own copy.
class BlockImpl : public Layer {
 public:
  struct Plan {
    std::string name;
    enum class Kind { kSingle, kList, kDict } kind = Kind::kSingle;
    std::vector<bool> ids;  // per element: wants token ids
  };
  explicit BlockImpl(int64_t dim) : dim_(dim) {}
  std::vector<Plan> plans;

  torch::Tensor forward(const torch::Tensor& x) override {
    auto out = x;
    auto input = [&](bool ids) { return ids ? ids_from(x, dim_) : x; };
    for (const auto& plan : plans) {
      auto child = find_child(*this, plan.name);
      if (plan.kind == Plan::Kind::kSingle) {
        out = out + call(*child, input(plan.ids.at(0)));
      } else if (plan.kind == Plan::Kind::kList) {
        const auto list = std::dynamic_pointer_cast<torch::nn::ModuleListImpl>(child);
        if (!list) unexpected(plan, "a ModuleList", *child);
        size_t i = 0;
        for (const auto& m : *list) out = out + call(*m, input(element_ids(plan, i++)));
      } else {
        const auto dict = std::dynamic_pointer_cast<torch::nn::ModuleDictImpl>(child);
        if (!dict) unexpected(plan, "a ModuleDict", *child);
        size_t i = 0;
        for (const auto& m : dict->values()) out = out + call(*m, input(element_ids(plan, i++)));
      }
    }
    return out;
  }
  std::string python_name() const override { return "Block"; }

 private:
  /// The tree is not what this block was built with (an unwrap rewired it): an error naming the
  /// child, not a crash.
  [[noreturn]] static void unexpected(const Plan& plan, const std::string& wanted,
                                      const torch::nn::Module& found) {
    throw Error(ErrorCode::kNotForwardable, plan.name,
                "the generated Block expects " + wanted + " here, and finds " + found.name());
  }
  static bool element_ids(const Plan& plan, size_t i) {
    if (i >= plan.ids.size()) {
      throw Error(ErrorCode::kNotForwardable, plan.name + "." + std::to_string(i),
                  "the generated Block was built with " + std::to_string(plan.ids.size()) +
                      " elements here, and finds more");
    }
    return plan.ids[i];
  }

  int64_t dim_;
};

/// LibTorch 1.13 has no CPU kernels for float16 matrix products, normalisation or `rsqrt`: a
/// float16 tree on the CPU computes those in float32 and rounds back, as autocast would. Its
/// parameters, buffers, inputs, outputs and gradients stay float16.
bool computes_upcast(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf && t.device().is_cpu();
}
torch::Tensor up(const torch::Tensor& t, bool upcast) {
  return upcast && t.defined() ? t.to(torch::kFloat) : t;
}
torch::Tensor down(const torch::Tensor& t, bool upcast) {
  return upcast ? t.to(torch::kHalf) : t;
}

/// The generated trees' leaves read their parameters through the registry at call time (as
/// `wrapcert::Layer`s do), so a flat-parameter wrapper's views are what a forward through it
/// runs on, and gradients reach its flat parameter. They print as PyTorch's modules.
class LinearLeafImpl : public Layer {
 public:
  LinearLeafImpl(int64_t dim, bool bias, const torch::TensorOptions& options)
      : dim_(dim), bias_(bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(dim));
    register_parameter("weight", torch::empty({dim, dim}, options).uniform_(-bound, bound));
    if (bias) register_parameter("bias", torch::empty({dim}, options).uniform_(-bound, bound));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto w = parameter("weight");
    const bool u = computes_upcast(w);
    return down(at::linear(up(x, u), up(w, u), bias_ ? up(parameter("bias"), u) : at::Tensor()), u);
  }
  std::string python_name() const override { return "Linear"; }
  std::string extra_repr() const override {
    return "in_features=" + std::to_string(dim_) + ", out_features=" + std::to_string(dim_) +
           ", bias=" + (bias_ ? "True" : "False");
  }

 private:
  int64_t dim_;
  bool bias_;
};

class EmbeddingLeafImpl : public Layer {
 public:
  EmbeddingLeafImpl(int64_t dim, const torch::TensorOptions& options) : dim_(dim) {
    register_parameter("weight", torch::randn({dim, dim}, options));
  }
  torch::Tensor forward(const torch::Tensor& ids) override {
    return at::embedding(parameter("weight"), ids);
  }
  std::string python_name() const override { return "Embedding"; }
  std::string extra_repr() const override {
    return std::to_string(dim_) + ", " + std::to_string(dim_);
  }

 private:
  int64_t dim_;
};

class LayerNormLeafImpl : public Layer {
 public:
  LayerNormLeafImpl(int64_t dim, const torch::TensorOptions& options) : dim_(dim) {
    register_parameter("weight", torch::ones({dim}, options));
    register_parameter("bias", torch::zeros({dim}, options));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto w = parameter("weight");
    const bool u = computes_upcast(w);
    return down(at::layer_norm(up(x, u), {dim_}, up(w, u), up(parameter("bias"), u), 1e-5), u);
  }
  std::string python_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override {
    return "(" + std::to_string(dim_) + ",), eps=1e-05, elementwise_affine=True";
  }

 private:
  int64_t dim_;
};

class RMSNormImpl : public Layer {
 public:
  RMSNormImpl(int64_t dim, const torch::TensorOptions& options) {
    register_parameter("weight", torch::ones({dim}, options));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto w = parameter("weight");
    const bool u = computes_upcast(w);
    const auto h = up(x, u);
    return down(h * torch::rsqrt(h.pow(2).mean(-1, true) + 1e-6) * up(w, u), u);
  }
  std::string python_name() const override { return "RMSNorm"; }
};

class ScaleWithBufferImpl : public Layer {
 public:
  ScaleWithBufferImpl(int64_t dim, const torch::TensorOptions& options) {
    register_parameter("scale", torch::rand({dim}, options) + 0.5);
    register_buffer("running", torch::randn({dim}, options));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return x * parameter("scale") + named_buffers(/*recurse=*/false)["running"];
  }
  std::string python_name() const override { return "ScaleWithBuffer"; }
};

/// Computes differently in training and in eval mode (as dropout and batch norm do), and
/// deterministically: `x * scale` in training, half of it in eval. A wrapper that leaves its
/// inner module in the other mode changes what it computes.
class ModeScaleImpl : public Layer {
 public:
  ModeScaleImpl(int64_t dim, const torch::TensorOptions& options) {
    register_parameter("scale", torch::rand({dim}, options) + 0.5);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto y = x * parameter("scale");
    return is_training() ? y : y * 0.5;
  }
  std::string python_name() const override { return "ModeScale"; }
  std::string extra_repr() const override { return "eval_factor=0.5"; }
};

struct Builder {
  const TreeSpec& spec;
  int64_t dim;
  torch::TensorOptions options;  // what parameters and buffers are made in
  struct Done {
    ModulePtr module;
    bool ids;
  };
  std::vector<Done> done;  // finished nodes that may be shared
  std::set<const torch::nn::Module*> in_progress;
  std::vector<std::pair<torch::Tensor, ModulePtr>> tie_sources;         // weight, owner
  std::vector<std::pair<std::string, std::vector<std::string>>> wraps;  // post-order

  ModulePtr leaf(const NodeSpec& n, bool& ids) {
    ModulePtr m;
    switch (n.leaf) {
      case Leaf::kLinear:
      case Leaf::kLinearNoBias:
        m = std::make_shared<LinearLeafImpl>(dim, n.leaf == Leaf::kLinear, options);
        break;
      case Leaf::kEmbedding:
        m = std::make_shared<EmbeddingLeafImpl>(dim, options);
        ids = true;
        break;
      case Leaf::kLayerNorm:
        m = std::make_shared<LayerNormLeafImpl>(dim, options);
        break;
      case Leaf::kRMSNorm:
        m = std::make_shared<RMSNormImpl>(dim, options);
        break;
      case Leaf::kBuffered:
        m = std::make_shared<ScaleWithBufferImpl>(dim, options);
        break;
      case Leaf::kModeScale:
        m = std::make_shared<ModeScaleImpl>(dim, options);
        break;
      case Leaf::kTorchLinear: {
        // LibTorch's own module: made in its default dtype, then moved (the same tensors).
        auto linear = std::make_shared<torch::nn::LinearImpl>(torch::nn::LinearOptions(dim, dim));
        linear->to(options.dtype().toScalarType());
        m = linear;
        break;
      }
    }
    if (n.frozen) {
      for (auto& p : m->parameters(/*recurse=*/false)) p.set_requires_grad(false);
    }
    const bool tieable = n.leaf == Leaf::kLinear || n.leaf == Leaf::kLinearNoBias ||
                         n.leaf == Leaf::kEmbedding || n.leaf == Leaf::kTorchLinear;
    if (tieable) {
      if (n.tie >= 0 && !tie_sources.empty()) {
        tie_parameter(*m, "weight",
                      tie_sources[static_cast<size_t>(n.tie) % tie_sources.size()].first);
      }
      tie_sources.emplace_back(m->named_parameters(/*recurse=*/false)["weight"], m);
    }
    return m;
  }

  /// Builds `n` at `path` (the plain model's path); null when it has to be skipped.
  ModulePtr node(const NodeSpec& n, const std::string& path, bool in_sequential, bool& ids) {
    ids = false;
    if (n.type == NodeSpec::Type::kShared) {
      std::vector<const Done*> candidates;
      for (const auto& d : done) {
        // A Sequential chains float tensors through AnyModule, which cannot hold a Sequential.
        // nor anything but a Layer (LibTorch's Linear runs its own forward there).
        const bool fits =
            !in_sequential ||
            (!d.ids && !std::dynamic_pointer_cast<torch::nn::SequentialImpl>(d.module) &&
             std::dynamic_pointer_cast<Layer>(d.module));
        if (fits) candidates.push_back(&d);
      }
      if (candidates.empty()) return nullptr;
      const auto* pick = candidates[static_cast<size_t>(n.shared) % candidates.size()];
      ids = pick->ids;
      wraps.emplace_back(path, n.wrappers);
      return pick->module;
    }
    ModulePtr m;
    if (n.type == NodeSpec::Type::kLeaf) {
      // A Sequential runs its elements' own forward: token ids, and LibTorch's Linear (whose
      // forward reads its member, not the registry a wrapper rewires), have no place in one.
      if (in_sequential && (n.leaf == Leaf::kEmbedding || n.leaf == Leaf::kTorchLinear)) {
        return nullptr;
      }
      m = leaf(n, ids);
    } else {
      m = container(n, path, in_sequential);
      if (!m) return nullptr;
    }
    const bool is_list =
        n.type == NodeSpec::Type::kContainer &&
        (n.container == Container::kModuleList || n.container == Container::kModuleDict);
    if (!is_list) {
      wraps.emplace_back(path, n.wrappers);
      done.push_back({m, ids});
    }
    return m;
  }

  ModulePtr container(const NodeSpec& n, const std::string& path, bool in_sequential) {
    auto join = [&path](const std::string& name) {
      return path.empty() ? name : path + "." + name;
    };
    switch (n.container) {
      case Container::kCustom: {
        auto block = std::make_shared<BlockImpl>(dim);
        std::set<std::string> names;
        for (const auto& [raw, child_spec] : n.children) {
          std::string name = raw.empty() ? "m" : raw;
          while (!names.insert(name).second) name += "_";
          BlockImpl::Plan plan{name, BlockImpl::Plan::Kind::kSingle, {}};
          if (child_spec.type == NodeSpec::Type::kContainer &&
              (child_spec.container == Container::kModuleList ||
               child_spec.container == Container::kModuleDict)) {
            plan.kind = child_spec.container == Container::kModuleList
                            ? BlockImpl::Plan::Kind::kList
                            : BlockImpl::Plan::Kind::kDict;
            auto list = elements(child_spec, join(name), plan.ids);
            block->register_module(name, list);
          } else {
            bool ids = false;
            auto child = node(child_spec, join(name), /*in_sequential=*/false, ids);
            if (!child) continue;
            plan.ids = {ids};
            block->register_module(name, child);
          }
          block->plans.push_back(std::move(plan));
        }
        return block;
      }
      case Container::kSequential: {
        if (in_sequential) return nullptr;  // LibTorch cannot nest a Sequential in one
        torch::nn::Sequential seq;
        for (const auto& entry : n.children) {
          const auto& child_spec = entry.second;
          if (child_spec.type == NodeSpec::Type::kContainer &&
              child_spec.container != Container::kCustom) {
            continue;
          }
          bool ids = false;
          auto child = node(child_spec, join(std::to_string(seq->size())), true, ids);
          if (!child) continue;
          if (auto layer = std::dynamic_pointer_cast<Layer>(child)) {
            seq->push_back(std::move(layer));
          } else {
            throw Error(ErrorCode::kInvalidArgument, join(std::to_string(seq->size())),
                        "the spec builder cannot put a " + child->name() + " in a Sequential");
          }
        }
        if (seq->is_empty()) return nullptr;
        return seq.ptr();
      }
      case Container::kModuleList:
      case Container::kModuleDict:
        return nullptr;  // only as a custom module's child (see `container` above)
    }
    return nullptr;
  }

  /// The elements of a ModuleList or ModuleDict child, with whether each wants ids.
  ModulePtr elements(const NodeSpec& n, const std::string& path, std::vector<bool>& ids) {
    auto join = [&path](const std::string& name) { return path + "." + name; };
    if (n.container == Container::kModuleList) {
      torch::nn::ModuleList list;
      for (const auto& entry : n.children) {
        if (entry.second.type == NodeSpec::Type::kContainer &&
            entry.second.container != Container::kCustom) {
          continue;
        }
        bool wants = false;
        auto child = node(entry.second, join(std::to_string(list->size())), false, wants);
        if (!child) continue;
        list->push_back(child);
        ids.push_back(wants);
      }
      return list.ptr();
    }
    torch::nn::ModuleDict dict;
    std::set<std::string> names;
    for (const auto& [raw, child_spec] : n.children) {
      if (child_spec.type == NodeSpec::Type::kContainer &&
          child_spec.container != Container::kCustom) {
        continue;
      }
      std::string name = raw.empty() ? "m" : raw;
      while (!names.insert(name).second) name += "_";
      bool wants = false;
      auto child = node(child_spec, join(name), false, wants);
      if (!child) continue;
      dict->update(std::vector<std::pair<std::string, ModulePtr>>{{name, child}});
      ids.push_back(wants);
    }
    return dict.ptr();
  }
};

ModulePtr make_wrapper(const KindRef& kind, ModulePtr inner) {
  try {
    return kind.make(std::move(inner));
  } catch (...) {
    detail::note_blame("the wrapper kind " + kind.name() + " (building a wrapper)");
    throw;
  }
}

}  // namespace

Built build(const TreeSpec& spec, const BuildOptions& options) {
  torch::manual_seed(options.seed);
  // Parameters are made in the case's dtype (no conversion pass over the tree), except in the
  // half-precision ones, where they are drawn in float32 and rounded, as PyTorch's models are
  // made and then cast with `.half()` or `.bfloat16()`.
  const auto dtype = options.dtype.value_or(scalar_type(spec.dtype));
  const auto made_in = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  Builder builder{spec, spec.dim, torch::TensorOptions().dtype(made_in), {}, {}, {}, {}};
  auto root = builder.container(spec.root, "", false);
  if (!root) root = std::make_shared<BlockImpl>(spec.dim);
  builder.wraps.emplace_back("", spec.root.wrappers);
  if (dtype != made_in) root->to(dtype);
  if (spec.eval) root->eval();

  Built built;
  built.original = state_dict(root);
  built.root = root;
  if (!options.wrap) return built;

  // Post-order: a node is wrapped after everything under it, so wrapping never moves a path
  // still to be wrapped; the root's own stack goes on last.
  for (const auto& [path, kinds] : builder.wraps) {
    for (const auto& kind : kinds) {
      const auto ref = Registry::global().resolve(kind);
      auto target = module_at(built.root, path);
      auto wrapper = make_wrapper(ref, target);
      built.root = replace_at(built.root, path, wrapper);
      auto w = std::dynamic_pointer_cast<WrapperImpl>(wrapper);
      if (!w) {
        throw Error(ErrorCode::kInvalidArgument, path,
                    "the wrapper kind " + ref.name() +
                        " makes a module that does not derive from wrapcert::WrapperImpl");
      }
      built.wrappers.push_back(w);
      built.kinds.push_back(kind);
      switch (ref.numerics()) {
        case Numerics::kBitwise:
          break;
        case Numerics::kTolerance:
          built.tolerance = std::max(built.tolerance, ref.kind->tolerance);
          break;
        case Numerics::kChangesOutput:
          built.changes_output = true;
          break;
        case Numerics::kNeedsRelease:
          built.needs_release = true;
          break;
      }
    }
  }
  // Wrappers follow the model's mode, as `model.eval()` sets it on every submodule.
  if (spec.eval) built.root->eval();
  return built;
}

torch::Tensor sample_input(const TreeSpec& spec, c10::ScalarType dtype, uint64_t seed,
                           int64_t batch) {
  torch::manual_seed(seed + 7919);
  return torch::randn({batch < 0 ? spec.batch : batch, spec.dim},
                      torch::TensorOptions().dtype(torch::kDouble))
      .to(dtype);
}

c10::ScalarType scalar_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat64:
      return torch::kDouble;
    case Dtype::kFloat32:
      return torch::kFloat;
    case Dtype::kBFloat16:
      return torch::kBFloat16;
    case Dtype::kFloat16:
      return torch::kHalf;
  }
  return torch::kDouble;
}

double epsilon(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat64:
      return std::numeric_limits<double>::epsilon();
    case Dtype::kFloat32:
      return std::numeric_limits<float>::epsilon();
    case Dtype::kBFloat16:
      return 0.0078125;  // 2^-7: 8 significant bits
    case Dtype::kFloat16:
      return 0.0009765625;  // 2^-10: 11 significant bits
  }
  return 0.0;
}

const char* to_string(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgdMomentum:
      return "SGD(momentum=0.9)";
    case Optimizer::kAdam:
      return "Adam";
  }
  return "unknown";
}

const char* to_string(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat64:
      return "float64";
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat16:
      return "float16";
  }
  return "unknown";
}

SpecStats stats(const TreeSpec& spec) {
  SpecStats s;
  std::function<void(const NodeSpec&, int)> walk = [&](const NodeSpec& n, int depth) {
    s.depth = std::max(s.depth, depth);
    s.wrappers += static_cast<int>(n.wrappers.size());
    if (n.type == NodeSpec::Type::kShared) {
      ++s.shared;
      return;
    }
    ++s.modules;
    if (n.tie >= 0) ++s.ties;
    if (n.type == NodeSpec::Type::kLeaf) {
      s.frozen += n.frozen ? 1 : 0;
      s.mode_leaves += n.leaf == Leaf::kModeScale ? 1 : 0;
      s.cloneable += n.leaf == Leaf::kTorchLinear ? 1 : 0;
    }
    for (const auto& c : n.children) walk(c.second, depth + 1);
  };
  walk(spec.root, 0);
  return s;
}

}  // namespace wrapcert::gen
