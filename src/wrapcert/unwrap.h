#pragma once
/// The three unwrap subjects, side by side so each can be measured against the others.
///
///   auto view = wrapcert::unwrap_reference(wrapped);     // read-only, wrapped model untouched
///   auto clean_keys = wrapcert::keys(view.state_dict());
///   {
///     wrapcert::ScopedUnwrap scope(wrapped);             // runnable, restored at scope end
///     auto y = wrapcert::call(*scope.root(), x);           // runs through no wrapper
///   }
///
/// `legacy` and `duck_typed` reproduce behaviours that real projects shipped; they are kept as
/// subjects so that tests and reports can show how they fail (docs/SEMANTICS.md §2, hazards 1-3).

#include <wrapcert/view.h>

#include <string_view>
#include <vector>

namespace wrapcert {

/// The unwrap functions wrapcert ships: the reference and the two it replaces. Certification
/// runs any of them as its subject (`props::subject`), or an unwrap function of your own.
enum class BuiltinUnwrap {
  kLegacy,     ///< follow the wrapper chain from the root only (the pre-fix behaviour)
  kDuckTyped,  ///< accelerate's `recursive=True`: anything with a `module` attribute, in place
  kReference,  ///< type-directed, recursive, non-destructive
};

std::string_view to_string(BuiltinUnwrap subject);
/// "legacy", "duck_typed" or "reference"; throws `Error` (kInvalidArgument) otherwise.
BuiltinUnwrap subject_from_string(std::string_view name);
std::vector<BuiltinUnwrap> all_subjects();

/// Sees through every wrapper of a kind registered in `registry` (which must outlive it).
SeeThrough registered_wrappers(const Registry& registry);

/// The entries of a subject's result that still sit under a wrapper: what it failed to unwrap.
StateDict wrapped_state(const ModuleView& result, const Registry& registry = Registry::global());

/// Follows wrappers of registered kinds from the root and returns the first module that is not
/// one; inner wrappers stay. Changes nothing. Throws `Error` (kCycle) on a wrapper cycle.
ModulePtr unwrap_legacy(const ModulePtr& root, const Registry& registry = Registry::global());

/// The library fix, verbatim in spirit:
///
///   def _recursive_unwrap(module):
///       unwrapped = _recursive_unwrap(module.module) if hasattr(module, "module") else module
///       for name, child in unwrapped.named_children():
///           setattr(unwrapped, name, _recursive_unwrap(child))
///       return unwrapped
///
/// `hasattr(m, "module")` holds for a child registered as `module` (any module, wrapper or not),
/// a kind with a `module` alias, or a kind that forwards attribute access to an inner module
/// that has one. It rewires the live model in place, and like Python it stops with an `Error`
/// (kRecursionLimit) past 1000 nested calls, which is also how a cycle ends.
ModulePtr unwrap_duck_typed(const ModulePtr& root, const Registry& registry = Registry::global());

/// The tree seen through every wrapper of a registered kind, wherever it sits. Changes nothing;
/// each module is visited once; cycles, empty slots and undeclared wrapper state are `Error`s
/// naming the key path.
ModuleView unwrap_reference(const ModulePtr& root, const Registry& registry = Registry::global());

/// Any subject's result as a view. For `kLegacy` and `kDuckTyped` the view shows the module the
/// subject returned, as it is; `kDuckTyped` has changed `root` in place by then.
ModuleView unwrap(BuiltinUnwrap subject, const ModulePtr& root,
                  const Registry& registry = Registry::global());

/// A permanent unwrap, as a trainer does before saving for good: every wrapper of a registered
/// kind is released (`WrapperKind::release`, flat parameters restored; else its `inner`) and
/// its parent holds what the release returned instead. Returns the new root. The wrappers still
/// hold their inner modules and pass calls through. Throws like `unwrap_reference` on a cycle,
/// an empty slot or undeclared wrapper state, before anything is released.
ModulePtr release_wrappers(const ModulePtr& root, const Registry& registry = Registry::global());

/// Rewires the model in place so that no wrapper of a registered kind is on any path, and
/// restores every rewired parent exactly when the scope ends, also when leaving by exception.
/// While the scope lives, run `root()`: the wrapped root's own chain is left as it was.
class ScopedUnwrap {
 public:
  explicit ScopedUnwrap(const ModulePtr& root, const Registry& registry = Registry::global());
  /// The same from a view `unwrap_reference` gave of the model as it is now (the tree unchanged
  /// since): the view is read, not built again.
  explicit ScopedUnwrap(const ModuleView& view);
  ~ScopedUnwrap();
  ScopedUnwrap(const ScopedUnwrap&) = delete;
  ScopedUnwrap& operator=(const ScopedUnwrap&) = delete;

  /// The unwrapped root module.
  const ModulePtr& root() const { return root_; }
  /// How many parent entries were rewired.
  size_t rewired() const { return rewires_.size(); }

 private:
  struct Rewire {
    ModulePtr parent;
    std::string name;
    ModulePtr original;
  };
  void restore() noexcept;

  ModulePtr root_;
  std::vector<Rewire> rewires_;
};

}  // namespace wrapcert
