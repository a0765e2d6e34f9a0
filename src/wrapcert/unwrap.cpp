#include <wrapcert/detail/blame.h>
#include <wrapcert/detail/path.h>
#include <wrapcert/error.h>
#include <wrapcert/unwrap.h>
#include <wrapcert/wrap.h>

#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

using detail::join_path;

constexpr int kPythonRecursionLimit = 1000;

/// Python's `getattr(m, "module", None)` on the real wrappers' classes.
ModulePtr module_attribute(ModulePtr m, const Registry& registry, const std::string& path) {
  for (int hops = 0; hops < kPythonRecursionLimit; ++hops) {
    if (auto child = find_child(*m, "module")) return child;
    const WrapperKind* kind = registry.find(*m);
    if (!kind) return nullptr;
    for (const auto& alias : kind->aliases) {
      if (alias == "module") return kind->alias_of(*m, alias, path);
    }
    if (!kind->forwards_attributes) return nullptr;
    m = kind->inner_of(*m, path);  // `__getattr__` falls through to the inner module
  }
  throw Error(ErrorCode::kRecursionLimit, path,
              "maximum recursion depth exceeded while forwarding attribute 'module'");
}

ModulePtr duck_unwrap(const ModulePtr& module, const Registry& registry, int depth,
                      const std::string& path) {
  if (depth > kPythonRecursionLimit) {
    throw Error(ErrorCode::kRecursionLimit, path,
                "maximum recursion depth exceeded (Python's default limit is " +
                    std::to_string(kPythonRecursionLimit) + "; a cycle ends here too)");
  }
  ModulePtr unwrapped = module;
  if (auto inner = module_attribute(module, registry, path)) {
    unwrapped = duck_unwrap(inner, registry, depth + 1, join_path(path, "module"));
  }
  for (const auto& item : unwrapped->named_children()) {
    replace_child(*unwrapped, item.key(),
                  duck_unwrap(item.value(), registry, depth + 1, join_path(path, item.key())));
  }
  return unwrapped;
}

/// `registry.find` once per module type for the length of one walk: the registry knows kinds by
/// dynamic type alone, and hashing the type's name for every module was half of a walk's time.
/// A type seen through another `type_info` object (one per shared library, at worst) is only
/// asked again.
class KindsByType {
 public:
  explicit KindsByType(const Registry& registry) : registry_(registry) {}

  const WrapperKind* operator()(const torch::nn::Module& module) {
    const std::type_info* type = &typeid(module);
    for (const auto& [seen, kind] : seen_) {
      if (seen == type) return kind;
    }
    const WrapperKind* kind = registry_.find(module);
    if (seen_.size() < kMaxTypes) seen_.emplace_back(type, kind);  // beyond: a search each time
    return kind;
  }

 private:
  static constexpr size_t kMaxTypes = 64;  // a linear search stays cheaper than hashing a name
  const Registry& registry_;
  std::vector<std::pair<const std::type_info*, const WrapperKind*>> seen_;
};

}  // namespace

std::string_view to_string(BuiltinUnwrap subject) {
  switch (subject) {
    case BuiltinUnwrap::kLegacy:
      return "legacy";
    case BuiltinUnwrap::kDuckTyped:
      return "duck_typed";
    case BuiltinUnwrap::kReference:
      return "reference";
  }
  return "unknown";
}

BuiltinUnwrap subject_from_string(std::string_view name) {
  for (BuiltinUnwrap s : all_subjects()) {
    if (to_string(s) == name) return s;
  }
  throw Error(
      ErrorCode::kInvalidArgument, "",
      "unknown unwrap subject '" + std::string(name) + "' (known: legacy, duck_typed, reference)");
}

std::vector<BuiltinUnwrap> all_subjects() {
  return {BuiltinUnwrap::kLegacy, BuiltinUnwrap::kDuckTyped, BuiltinUnwrap::kReference};
}

ModulePtr unwrap_legacy(const ModulePtr& root, const Registry& registry) {
  if (!root) throw Error(ErrorCode::kInvalidArgument, "", "cannot unwrap a null module");
  ModulePtr module = root;
  std::unordered_set<const torch::nn::Module*> seen;
  std::vector<const std::string*> slots;  // spelled out only for an error: no quadratic paths
  auto path = [&slots] {
    std::string out;
    for (const auto* slot : slots) out = join_path(out, *slot);
    return out;
  };
  while (const WrapperKind* kind = registry.find(*module)) {
    if (!seen.insert(module.get()).second) {
      throw Error(ErrorCode::kCycle, path(), kind->name + " is its own ancestor");
    }
    auto inner = kind->inner ? kind->inner(*module) : find_child(*module, kind->slot);
    if (!inner)
      throw Error(ErrorCode::kEmptySlot, path(), kind->name + " has no module in its slot");
    slots.push_back(&kind->slot);
    module = std::move(inner);
  }
  return module;
}

ModulePtr unwrap_duck_typed(const ModulePtr& root, const Registry& registry) {
  if (!root) throw Error(ErrorCode::kInvalidArgument, "", "cannot unwrap a null module");
  return duck_unwrap(root, registry, 1, "");
}

SeeThrough registered_wrappers(const Registry& registry) {
  return [&registry](const torch::nn::Module& m) { return registry.find(m); };
}

StateDict wrapped_state(const ModuleView& result, const Registry& registry) {
  KindsByType kinds(registry);
  return result.state_through([&kinds](const torch::nn::Module& m) { return kinds(m); });
}

ModuleView unwrap_reference(const ModulePtr& root, const Registry& registry) {
  KindsByType kinds(registry);
  return ModuleView::build(root, [&kinds](const torch::nn::Module& m) { return kinds(m); });
}

ModuleView unwrap(BuiltinUnwrap subject, const ModulePtr& root, const Registry& registry) {
  switch (subject) {
    case BuiltinUnwrap::kLegacy:
      return ModuleView::of(unwrap_legacy(root, registry));
    case BuiltinUnwrap::kDuckTyped:
      return ModuleView::of(unwrap_duck_typed(root, registry));
    case BuiltinUnwrap::kReference:
      return unwrap_reference(root, registry);
  }
  throw Error(ErrorCode::kInvalidArgument, "", "unknown unwrap subject");
}

ModulePtr release_wrappers(const ModulePtr& root, const Registry& registry) {
  const ModuleView view = unwrap_reference(root, registry);          // validates before any release
  std::unordered_map<const torch::nn::Module*, ModulePtr> released;  // a shared wrapper once
  auto strip = [&](ModulePtr m, const std::string& path) {
    while (const WrapperKind* kind = registry.find(*m)) {
      auto& done = released[m.get()];
      if (!done) {
        try {
          done = kind->release ? kind->release(*m) : kind->inner_of(*m, path);
        } catch (...) {
          detail::note_blame("the wrapper kind " + kind->name + " (releasing at '" + path + "')");
          throw;
        }
        if (!done) {
          throw Error(ErrorCode::kEmptySlot, path, kind->name + "'s release returned no module");
        }
      }
      m = done;
    }
    return m;
  };
  auto new_root = strip(root, "");
  for (size_t i = 0; i < view.size(); ++i) {
    const auto& node = view.node(i);
    for (const auto& edge : node.children) {
      if (edge.via.empty()) continue;
      const std::string name(edge.name);
      replace_child(*node.module, name, strip(find_child(*node.module, name), name));
    }
  }
  return new_root;
}

ScopedUnwrap::ScopedUnwrap(const ModulePtr& root, const Registry& registry)
    : ScopedUnwrap(unwrap_reference(root, registry)) {}

ScopedUnwrap::ScopedUnwrap(const ModuleView& view) {
  root_ = view.root().module;
  try {
    for (size_t i = 0; i < view.size(); ++i) {
      const auto& node = view.node(i);
      for (const auto& edge : node.children) {
        if (edge.via.empty()) continue;
        std::string name(edge.name);
        auto original = find_child(*node.module, name);
        replace_child(*node.module, name, view.node(edge.node).module);
        rewires_.push_back(Rewire{node.module, std::move(name), std::move(original)});
      }
    }
  } catch (...) {
    restore();
    throw;
  }
}

ScopedUnwrap::~ScopedUnwrap() {
  restore();
}

void ScopedUnwrap::restore() noexcept {
  // Each original was a valid child of its parent a moment ago, so putting it back cannot fail;
  // if it ever did, terminating beats running on a half-restored model.
  for (auto it = rewires_.rbegin(); it != rewires_.rend(); ++it) {
    replace_child(*it->parent, it->name, it->original);
  }
  rewires_.clear();
}

}  // namespace wrapcert
