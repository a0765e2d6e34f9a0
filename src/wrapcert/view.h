#pragma once
/// A read-only view of a module tree, optionally seeing through wrappers, and its state dict.
/// Functions on a tree's state dict as it is (`state_dict`, `load_state_dict`, `keys`) are in
/// state_dict.h.
///
///   auto view = wrapcert::ModuleView::of(model);            // the tree as it is
///   auto sd = view.state_dict();                             // PyTorch's key order
///   for (const auto& item : sd) std::cout << item.key() << "\n";
///
/// Each module is visited once: a module reached by two paths is one node with two incoming
/// edges (shared submodules stay shared), and a module that is its own ancestor is an `Error`
/// (kCycle) naming the path. The walk uses an explicit stack, so depth is not limited.

#include <wrapcert/registry.h>

#include <c10/util/ArrayRef.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wrapcert {

/// Ordered key -> tensor, in `torch.nn.Module.state_dict()` order: a module's parameters, then
/// its persistent buffers, then each child in registration order.
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

/// For a module met on the walk: the wrapper kind to see through, or nullptr to keep it.
using SeeThrough = std::function<const WrapperKind*(const torch::nn::Module&)>;

/// Names, edges and slots live in storage the view owns and its copies share: they stay valid
/// as long as any copy of the view does, whatever happens to the modules afterwards.
class ModuleView {
 public:
  struct Edge {
    std::string_view name;  ///< the child's name in the parent's registry (a copy the view owns)
    size_t node;            ///< index of the child node
    /// Slot names of the wrappers seen through between parent and child, outermost first;
    /// the wrapped key of a child tensor is `name.via[0].via[1]....key`.
    c10::ArrayRef<std::string_view> via;
  };
  struct Node {
    ModulePtr module;
    c10::ArrayRef<Edge> children;  ///< in the parent's registration order
  };

  /// The tree as it is: wrappers are ordinary nodes.
  static ModuleView of(const ModulePtr& root);
  /// The tree seen through every module for which `see_through` returns a kind.
  static ModuleView build(const ModulePtr& root, const SeeThrough& see_through);

  const Node& root() const { return nodes_.front(); }
  const Node& node(size_t index) const { return nodes_.at(index); }
  size_t size() const { return nodes_.size(); }
  /// Slots of the wrappers seen through above the root, outermost first.
  c10::ArrayRef<std::string_view> root_via() const { return root_via_; }

  /// Parameters and persistent buffers; undefined tensors (a `bias=false` Linear) are absent.
  StateDict state_dict() const;
  /// Calls `fn(clean_key, wrapped_key, tensor)` for each state-dict entry in order, where the
  /// wrapped key spells out the slots of the wrappers seen through.
  void for_each_state(const std::function<void(const std::string&, const std::string&,
                                               const torch::Tensor&)>& fn) const;
  /// The state-dict entries whose path passes through (or belongs to) a node for which
  /// `is_wrapper` returns a kind: what a subject left wrapped.
  StateDict state_through(const SeeThrough& is_wrapper) const;
  /// Module paths in pre-order, each path once per way of reaching it ("" is the root).
  std::vector<std::string> module_paths() const;

 private:
  using StateFn = std::function<void(const std::string&, const std::string&, const torch::Tensor&,
                                     bool through)>;
  void walk_state(const SeeThrough& is_wrapper, const StateFn& fn) const;
  /// Throws `Error` (kTooManyPaths) naming the most-reached module when walking every path
  /// (as state dicts do: a shared module appears under each) would visit more than
  /// `kMaxVisits` modules: a lattice of shared modules has exponentially many paths.
  void check_path_count() const;

  static constexpr uint64_t kMaxVisits = uint64_t{1} << 24;

  struct Storage;  // names, edges and slots; never changed once built
  std::vector<Node> nodes_;
  std::shared_ptr<const Storage> storage_;
  c10::ArrayRef<std::string_view> root_via_;
  bool show_held_ = false;  // a view through wrappers shows what flattening wrappers hold
};

}  // namespace wrapcert
