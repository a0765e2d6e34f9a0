#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/printer.h>
#include <wrapcert/state_dict.h>

#include <rapidcheck.h>

#include <functional>
#include <ostream>
#include <set>
#include <sstream>

namespace wrapcert::gen {
namespace {

using Child = std::pair<std::string, NodeSpec>;

rc::Gen<std::string> child_name(const GenOptions& o) {
  auto plain =
      rc::gen::element<std::string>("fc", "block", "proj", "norm", "head", "layer", "0", "1", "12");
  if (!o.adversarial_names) return plain;
  auto slots = rc::gen::element<std::string>("module", "_orig_mod", "_orig_module",
                                             "_fsdp_wrapped_module", "_checkpoint_wrapped_module");
  auto near = rc::gen::element<std::string>("my_fsdp_wrapped_module", "module_list", "orig_mod",
                                            "modules", "x_orig_module", "module1");
  return rc::gen::weightedOneOf<std::string>({{6, plain}, {2, slots}, {2, near}});
}

/// Kinds that change outputs (an fp32 output conversion) go only at the root, as accelerate
/// applies them: inside a double model they would feed float32 to the next layer.
rc::Gen<std::vector<std::string>> stack(const GenOptions& o, bool allowed, bool root = false) {
  if (!o.wrappers || !allowed) return rc::gen::just(std::vector<std::string>{});
  std::vector<std::string> kinds;
  for (const auto& k : o.kinds) {
    // A kind or a mode (`Kind[mode]`); a name not registered yet fails when the tree is built.
    Numerics numerics = Numerics::kBitwise;
    try {
      numerics = Registry::global().resolve(k).numerics();
    } catch (const Error&) {
    }
    if (root || numerics != Numerics::kChangesOutput) kinds.push_back(k);
  }
  if (kinds.empty()) return rc::gen::just(std::vector<std::string>{});
  auto kind = rc::gen::elementOf(kinds);
  auto some = rc::gen::mapcat(rc::gen::inRange(1, 4), [kind](int n) {
    return rc::gen::container<std::vector<std::string>>(static_cast<size_t>(n), kind);
  });
  return rc::gen::weightedOneOf<std::vector<std::string>>(
      {{3, rc::gen::just(std::vector<std::string>{})}, {2, some}});
}

rc::Gen<NodeSpec> leaf(const GenOptions& o) {
  auto tie =
      o.sharing ? rc::gen::weightedOneOf<int>({{4, rc::gen::just(-1)}, {1, rc::gen::inRange(0, 8)}})
                : rc::gen::just(-1);
  // Shrinking goes towards the first leaf kind and unfrozen parameters.
  auto kind = o.training ? rc::gen::element(Leaf::kLinear, Leaf::kLinearNoBias, Leaf::kEmbedding,
                                            Leaf::kLayerNorm, Leaf::kRMSNorm, Leaf::kBuffered,
                                            Leaf::kModeScale, Leaf::kTorchLinear)
                         : rc::gen::element(Leaf::kLinear, Leaf::kLinearNoBias, Leaf::kEmbedding,
                                            Leaf::kLayerNorm, Leaf::kRMSNorm, Leaf::kBuffered);
  auto frozen =
      o.training
          ? rc::gen::weightedOneOf<bool>({{4, rc::gen::just(false)}, {1, rc::gen::just(true)}})
          : rc::gen::just(false);
  return rc::gen::build<NodeSpec>(rc::gen::set(&NodeSpec::leaf, kind),
                                  rc::gen::set(&NodeSpec::wrappers, stack(o, !o.root_chain_only)),
                                  rc::gen::set(&NodeSpec::tie, tie),
                                  rc::gen::set(&NodeSpec::frozen, frozen));
}

/// A container's own subtrees are offered as replacements for it, so counterexamples shrink to
/// the part that fails.
rc::Seq<NodeSpec> subtrees(const NodeSpec& n) {
  std::vector<NodeSpec> out;
  for (const auto& c : n.children) out.push_back(c.second);
  return rc::seq::fromContainer(std::move(out));
}

rc::Gen<NodeSpec> node(const GenOptions& o, int depth) {
  if (depth <= 0) return leaf(o);
  auto child = rc::gen::lazy([o, depth] { return node(o, depth - 1); });
  auto children = rc::gen::mapcat(rc::gen::inRange(1, 4), [o, child](int n) {
    return rc::gen::container<std::vector<Child>>(static_cast<size_t>(n),
                                                  rc::gen::pair(child_name(o), child));
  });
  auto container = rc::gen::shrink(
      rc::gen::build<NodeSpec>(
          rc::gen::set(&NodeSpec::type, rc::gen::just(NodeSpec::Type::kContainer)),
          rc::gen::set(&NodeSpec::container,
                       rc::gen::element(Container::kCustom, Container::kSequential,
                                        Container::kModuleList, Container::kModuleDict)),
          rc::gen::set(&NodeSpec::children, children),
          rc::gen::set(&NodeSpec::wrappers, stack(o, !o.root_chain_only))),
      [](const NodeSpec& n) { return subtrees(n); });
  if (!o.sharing) return rc::gen::weightedOneOf<NodeSpec>({{4, leaf(o)}, {3, container}});
  auto shared = rc::gen::build<NodeSpec>(
      rc::gen::set(&NodeSpec::type, rc::gen::just(NodeSpec::Type::kShared)),
      rc::gen::set(&NodeSpec::shared, rc::gen::inRange(0, 20)),
      rc::gen::set(&NodeSpec::wrappers, stack(o, !o.root_chain_only)));
  return rc::gen::weightedOneOf<NodeSpec>({{4, leaf(o)}, {3, container}, {1, shared}});
}

}  // namespace

rc::Gen<TreeSpec> trees(GenOptions options) {
  if (options.kinds.empty()) options.kinds = Registry::global().names();
  auto children = rc::gen::mapcat(rc::gen::inRange(1, 5), [options](int n) {
    auto child = rc::gen::lazy([options] { return node(options, options.max_depth - 1); });
    return rc::gen::container<std::vector<Child>>(static_cast<size_t>(n),
                                                  rc::gen::pair(child_name(options), child));
  });
  GenOptions root_options = options;
  root_options.root_chain_only = false;
  // Shrinking goes towards the first dtype and training mode: a failure that needs another
  // dtype or eval mode keeps it.
  const auto dtypes = options.dtypes.empty() ? std::vector<Dtype>{Dtype::kFloat64} : options.dtypes;
  return rc::gen::build<TreeSpec>(
      rc::gen::set(&TreeSpec::root,
                   rc::gen::build<NodeSpec>(
                       rc::gen::set(&NodeSpec::type, rc::gen::just(NodeSpec::Type::kContainer)),
                       rc::gen::set(&NodeSpec::container, rc::gen::just(Container::kCustom)),
                       rc::gen::set(&NodeSpec::children, children),
                       rc::gen::set(&NodeSpec::wrappers, stack(root_options, true, true)))),
      rc::gen::set(&TreeSpec::dtype, rc::gen::elementOf(dtypes)),
      // Widths 1 to 8 (primes among them), so that 2, 3 and 4 ranks see even, uneven and empty
      // shards; a single example beside a batch of 1 to 5. Both shrink towards the smallest.
      rc::gen::set(&TreeSpec::dim, rc::gen::inRange<int64_t>(1, 9)),
      rc::gen::set(&TreeSpec::batch, rc::gen::inRange<int64_t>(1, 6)),
      rc::gen::set(&TreeSpec::optimizer,
                   rc::gen::element(Optimizer::kSgdMomentum, Optimizer::kAdam)),
      rc::gen::set(&TreeSpec::eval,
                   options.eval_mode ? rc::gen::element(false, true) : rc::gen::just(false)));
}

std::string describe(const TreeSpec& spec, const std::string& highlight) {
  try {
    return describe(spec, build(spec, {std::nullopt, 0, true}), highlight);
  } catch (const std::exception& e) {
    const std::string what = e.what();  // LibTorch appends a backtrace: the first line says why
    return "<the spec does not build: " + what.substr(0, what.find('\n')) + ">";
  }
}

std::string describe(const TreeSpec& spec, const Built& built, const std::string& highlight) {
  std::string listing;
  std::istringstream lines(format_keys(state_dict(built.root)));
  for (std::string line; std::getline(lines, line);) {
    const auto key = line.substr(0, line.find(' '));
    const bool hit = !highlight.empty() &&
                     (key == highlight || (key.size() > highlight.size() &&
                                           key.compare(key.size() - highlight.size() - 1,
                                                       std::string::npos, "." + highlight) == 0));
    listing += line + (hit ? "  <-- here" : "") + "\n";
  }
  // Counted on the tree as printed: each module once, however often it is reached.
  const auto view = ModuleView::of(built.root);
  size_t modules = 0;
  for (size_t i = 0; i < view.size(); ++i) {
    modules += dynamic_cast<const WrapperImpl*>(view.node(i).module.get()) == nullptr;
  }
  std::string running = std::string("built in ") + to_string(spec.dtype) + ", " +
                        std::to_string(spec.dim) + " wide, run in " +
                        (spec.eval ? "eval" : "training") + " mode on a batch of " +
                        std::to_string(spec.batch) + ", trained with " + to_string(spec.optimizer) +
                        (spec.dtype != Dtype::kFloat64 ? " on float64 master weights" : "") + "\n";
  // PyTorch's print does not show what is frozen: the keys are listed.
  std::set<const void*> buffers;
  for (const auto& b : built.root->buffers()) buffers.insert(b.unsafeGetTensorImpl());
  std::string frozen;
  for (const auto& item : built.original) {
    if (!item.value().requires_grad() && !buffers.count(item.value().unsafeGetTensorImpl())) {
      frozen += (frozen.empty() ? "" : ", ") + item.key();
    }
  }
  if (!frozen.empty()) running += "frozen (requires_grad=False): " + frozen + "\n";
  return running + format_tree(built.root) + "\nwrapped keys:\n" + listing +
         std::to_string(modules) + " modules, " + std::to_string(view.size() - modules) +
         " wrappers";
}

void showValue(const TreeSpec& spec, std::ostream& os) {
  os << "\n" << describe(spec);
}

void classify(const TreeSpec& spec) {
  const auto s = stats(spec);
  RC_TAG("depth " + std::to_string(s.depth));
  RC_CLASSIFY(s.wrappers == 0, "no wrappers");
  RC_CLASSIFY(s.shared > 0, "shared submodule");
  RC_CLASSIFY(s.ties > 0, "tied weights");
  RC_CLASSIFY(s.frozen > 0, "frozen parameters");
  RC_CLASSIFY(s.mode_leaves > 0, "a leaf that computes by mode");
  RC_CLASSIFY(s.cloneable > 0, "a cloneable LibTorch leaf");
  bool adversarial = false;
  std::set<std::string> kinds;
  std::function<void(const NodeSpec&)> walk = [&](const NodeSpec& n) {
    for (const auto& k : n.wrappers) kinds.insert(k);
    for (const auto& [name, c] : n.children) {
      adversarial = adversarial || name.find("module") != std::string::npos ||
                    name.find("orig_mod") != std::string::npos;
      walk(c);
    }
  };
  walk(spec.root);
  RC_CLASSIFY(adversarial, "adversarial names");
  for (const auto& k : kinds) RC_CLASSIFY(true, k);
}

}  // namespace wrapcert::gen
