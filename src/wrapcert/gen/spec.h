#pragma once
/// Plain value trees that describe a module tree and where it is wrapped: what the generators
/// produce and shrink, and what each property run builds fresh modules from.
///
///   gen::TreeSpec spec;
///   spec.root.children.push_back({"fc", gen::NodeSpec::leaf(gen::Leaf::kLinear)});
///   spec.root.children.back().second.wrappers = {"FullyShardedDataParallel"};

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert::gen {

/// The floating-point type a tree is built and run in.
enum class Dtype { kFloat64, kFloat32, kBFloat16, kFloat16 };
/// `float64`, `float32`, `bfloat16`, `float16`: PyTorch's names.
const char* to_string(Dtype dtype);
/// Every dtype, double first.
inline constexpr Dtype kAllDtypes[] = {Dtype::kFloat64, Dtype::kFloat32, Dtype::kBFloat16,
                                       Dtype::kFloat16};

/// kModeScale computes differently in training and in eval mode; kTorchLinear is LibTorch's own
/// `torch::nn::Linear` (cloneable, its forward run as Python's reads the registry); the others
/// are wrapcert's types, which LibTorch cannot clone.
enum class Leaf {
  kLinear,
  kLinearNoBias,
  kEmbedding,
  kLayerNorm,
  kRMSNorm,
  kBuffered,
  kModeScale,
  kTorchLinear
};
/// What the training loop (P17) steps the parameters with.
enum class Optimizer { kSgdMomentum, kAdam };
/// `SGD(momentum=0.9)`, `Adam`.
const char* to_string(Optimizer optimizer);
enum class Container { kCustom, kSequential, kModuleList, kModuleDict };

struct NodeSpec {
  enum class Type { kLeaf, kContainer, kShared };
  Type type = Type::kLeaf;
  Leaf leaf = Leaf::kLinear;
  Container container = Container::kCustom;
  /// Children in registration order. Names are used by custom modules and `ModuleDict`s
  /// (duplicates get a suffix); `Sequential` and `ModuleList` number their elements.
  std::vector<std::pair<std::string, NodeSpec>> children;
  /// Wrapper kinds around this node, innermost first.
  std::vector<std::string> wrappers;
  /// kShared: the same module as an earlier node (picked among those built by then, modulo
  /// their count); skipped when there is none.
  int shared = 0;
  /// Linear and Embedding leaves: when >= 0, the weight is tied to an earlier Linear or
  /// Embedding leaf's weight (picked modulo their count).
  int tie = -1;
  /// Leaves: the parameters are frozen (`requires_grad(false)`), as fine-tuning freezes layers.
  bool frozen = false;

  static NodeSpec leaf_of(Leaf leaf) {
    NodeSpec n;
    n.leaf = leaf;
    return n;
  }
  static NodeSpec container_of(Container c) {
    NodeSpec n;
    n.type = Type::kContainer;
    n.container = c;
    return n;
  }
};

struct TreeSpec {
  NodeSpec root = NodeSpec::container_of(Container::kCustom);
  /// Every leaf's width (and the input's): drawn from 1 to 8, so that shards across 2, 3 and 4
  /// ranks come out even, uneven and empty.
  int64_t dim = 3;
  /// The examples in a batch call (P4, P14, P17), besides the single-example calls.
  int64_t batch = 2;
  /// What the training loop (P17) steps with.
  Optimizer optimizer = Optimizer::kSgdMomentum;
  /// What the model is built in (its parameters, buffers and inputs).
  Dtype dtype = Dtype::kFloat64;
  /// Built in eval mode (`model.eval()`, wrappers included) rather than training mode.
  bool eval = false;
};

/// Counts modules and wrappers in a spec (shared nodes count once, at their first path).
struct SpecStats {
  int modules = 0;
  int wrappers = 0;
  int depth = 0;
  int shared = 0;
  int ties = 0;
  int frozen = 0;       ///< leaves whose parameters are frozen
  int mode_leaves = 0;  ///< leaves that compute differently in eval mode
  int cloneable = 0;    ///< LibTorch's own (cloneable) leaves
};
SpecStats stats(const TreeSpec& spec);

/// `FullyShardedDataParallel` in flat-parameter mode: the registry names its mode so.
inline constexpr const char* kFlatFsdp = "FullyShardedDataParallel[flat]";

}  // namespace wrapcert::gen
