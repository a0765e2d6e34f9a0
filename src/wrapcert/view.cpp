#include <wrapcert/detail/marks.h>
#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/detail/path.h>
#include <wrapcert/detail/wrapper_state.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/view.h>

#include <torch/utils.h>

#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

namespace wrapcert {
namespace {

using detail::child_table;
using detail::ChildTable;
using detail::join_path;
using detail::stray_state;

bool persistent(const torch::nn::Module& module, const std::string& buffer) {
  return !detail::has_mark(module, detail::non_persistent_mark(buffer));
}

/// Room the module index starts with: a decoder model of a few hundred modules never rehashes.
constexpr size_t kIndexStart = 512;

/// The sizes of the last view built on this thread. A model is viewed again and again (a save
/// loop, certification's cases, a benchmark), so the next view's arrays and index start at
/// those sizes: growing them (copies, rehashes, fresh pages) was half of a 10,000-module walk.
/// After a smaller model the next walk starts smaller again.
struct LastSizes {
  size_t nodes = kIndexStart;
  size_t edges = kIndexStart;
  size_t slots = 0;
};
thread_local LastSizes last_sizes;
/// A hint is not a limit: the index never starts at more than this (a million-module view
/// followed by small ones would clear a large table every time).
constexpr size_t kMostHinted = size_t{1} << 18;

/// The wrappers seen through on the current path (they are no nodes), in path order, each with
/// the depth of the frame it leads to. Most paths cross a few, searched in a short array; a long
/// chain's are indexed as well, so that a 100,000-deep chain stays linear.
class WrappersOnPath {
 public:
  /// The depth `wrapper` leads to, if it is on the path.
  std::optional<size_t> find(const torch::nn::Module* wrapper) const {
    for (size_t i = 0; i < std::min(path_.size(), kScanned); ++i) {
      if (path_[i].first == wrapper) return path_[i].second;
    }
    if (path_.size() > kScanned) {
      if (auto it = beyond_.find(wrapper); it != beyond_.end()) return it->second;
    }
    return std::nullopt;
  }
  void push(const torch::nn::Module* wrapper, size_t depth) {
    if (path_.size() >= kScanned) beyond_.emplace(wrapper, depth);
    path_.emplace_back(wrapper, depth);
  }
  size_t size() const { return path_.size(); }
  void truncate(size_t size) {
    for (size_t i = std::max(size, kScanned); i < path_.size(); ++i) beyond_.erase(path_[i].first);
    path_.resize(size);
  }

 private:
  static constexpr size_t kScanned = 16;
  std::vector<std::pair<const torch::nn::Module*, size_t>> path_;
  ska::flat_hash_map<const torch::nn::Module*, size_t> beyond_;
};

/// A node's block of edges, or an edge's `via` among the slots: offsets, as the arrays grow
/// while a walk runs.
struct Span {
  size_t first = 0;
  size_t count = 0;
};

/// A module on the walk's current path.
struct Frame {
  size_t node;
  size_t edge;                 // the edge into this node (kNoEdge for the root)
  const ChildTable* children;  // the module's own table, not a copy
  size_t next;
  size_t wrappers_begin;  // this frame's entries in `wrappers_on_path` start here
};

/// What a walk needs only while it runs. Each thread keeps one between walks, so that a large
/// model's index and arrays are neither handed back to the system nor faulted in again on the
/// next call (at 10,000 modules that was most of a walk). A walk started while another runs on
/// the thread (a kind's `inner` viewing a module) gets a fresh one.
struct WalkScratch {
  ska::flat_hash_map<const torch::nn::Module*, size_t> index;  // module -> node
  std::vector<const torch::nn::Module*> indexed;               // its keys, as inserted
  std::vector<size_t> depth_of;  // node -> its frame's depth while on the path
  std::vector<Span> edges_of;    // per node: its block of `edges`
  std::vector<Span> slots_of;    // per edge: its `via` in `slots`
  std::vector<Frame> stack;
  bool in_use = false;

  void clear() {
    // Clearing the table visits every bucket: a walk far smaller than the table's room (a small
    // tree, viewed again and again) erases its own keys instead.
    if (8 * indexed.size() < index.bucket_count()) {
      for (const auto* module : indexed) index.erase(module);
    } else {
      index.clear();
    }
    indexed.clear();
    depth_of.clear();
    edges_of.clear();
    slots_of.clear();
    stack.clear();
  }
};
thread_local WalkScratch thread_scratch;

/// Lends the thread's scratch to one walk, or a fresh one to a walk within a walk. Handed back
/// empty when the walk ends (also by exception); an index much larger than the walk needed (a
/// larger model viewed before) is let go, as clearing it would cost every later small walk.
class ScratchLease {
 public:
  ScratchLease() : scratch_(thread_scratch.in_use ? own_.emplace() : thread_scratch) {
    scratch_.in_use = true;
  }
  ~ScratchLease() {
    const size_t used = std::max(scratch_.index.size(), kIndexStart);
    if (scratch_.index.bucket_count() > 4 * used || scratch_.depth_of.capacity() > kMostHinted) {
      scratch_ = WalkScratch{};
    } else {
      scratch_.clear();
    }
    scratch_.in_use = false;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  WalkScratch& operator*() { return scratch_; }

 private:
  std::optional<WalkScratch> own_;
  WalkScratch& scratch_;
};

}  // namespace

struct ModuleView::Storage {
  /// Names and slots of a view: copied into chunks that never move, so views into them stay valid
  /// while the view's storage lives (the modules' own keys may change or go).
  class TextArena {
   public:
    std::string_view copy(std::string_view text) {
      if (text.empty()) return {};
      if (text.size() > free_) {
        const size_t size = std::max(kChunk, text.size());
        chunks_.emplace_back(new char[size]);
        next_ = chunks_.back().get();
        free_ = size;
      }
      std::memcpy(next_, text.data(), text.size());
      const std::string_view copied(next_, text.size());
      next_ += text.size();
      free_ -= text.size();
      return copied;
    }

   private:
    static constexpr size_t kChunk = 4096;
    std::vector<std::unique_ptr<char[]>> chunks_;
    char* next_ = nullptr;
    size_t free_ = 0;
  };

  TextArena text;
  std::vector<Edge> edges;              // each node's edges together, in registration order
  std::vector<std::string_view> slots;  // the root's `via`, then each edge's, together
};

ModuleView ModuleView::of(const ModulePtr& root) {
  return build(root, nullptr);
}

ModuleView ModuleView::build(const ModulePtr& root, const SeeThrough& see_through) {
  if (!root) throw Error(ErrorCode::kInvalidArgument, "", "cannot view a null module");
  ModuleView view;
  view.show_held_ = static_cast<bool>(see_through);
  auto storage = std::make_shared<Storage>();
  auto& edges = storage->edges;
  auto& slots = storage->slots;
  // Edges and slots are spans of the two arrays, which grow while the walk runs: they are
  // kept as offsets and turned into views once the walk is done.
  ScratchLease lease;
  auto& edges_of = (*lease).edges_of;  // per node: its block of `edges` (a slot per child)
  auto& slots_of = (*lease).slots_of;  // per edge: its `via` in `slots`
  Span root_slots;

  constexpr size_t kNotOnPath = static_cast<size_t>(-1);
  constexpr size_t kNoEdge = static_cast<size_t>(-1);
  auto& stack = (*lease).stack;
  // Every module viewed -> its node; a node's frame depth while it is on the current path.
  auto& index = (*lease).index;
  auto& indexed = (*lease).indexed;
  // Growing from nothing rehashes it at every doubling; a model's few hundred modules fit.
  const size_t nodes_hint = std::min(std::max(last_sizes.nodes, kIndexStart), kMostHinted);
  const size_t edges_hint = std::min(last_sizes.edges, kMostHinted);
  // A kept index already has its room: `reserve` would rehash it to the hint's size each time.
  if (index.bucket_count() < 2 * nodes_hint) index.reserve(nodes_hint);
  auto& depth_of = (*lease).depth_of;
  depth_of.reserve(nodes_hint);
  view.nodes_.reserve(nodes_hint);
  edges_of.reserve(nodes_hint);
  slots_of.reserve(edges_hint);
  edges.reserve(edges_hint);
  slots.reserve(std::min(last_sizes.slots, kMostHinted));
  WrappersOnPath wrappers_on_path;

  // Paths are spelled out only for error messages: building one per node would make a deep
  // chain quadratic. `depth` frames, then `edge` (a pending edge from the top frame, or none).
  auto path_of = [&](size_t depth, size_t edge) {
    std::string path;
    auto append_slots = [&](Span via) {
      for (size_t s = via.first; s < via.first + via.count; ++s) path = join_path(path, slots[s]);
    };
    auto append = [&](size_t e) {
      path = join_path(path, edges[e].name);
      append_slots(slots_of[e]);
    };
    append_slots(root_slots);
    for (size_t i = 1; i < depth; ++i) append(stack[i].edge);
    if (edge != kNoEdge) append(edge);
    return path;
  };
  auto cycle = [&](const torch::nn::Module& module, size_t depth, size_t edge) {
    const auto ancestor = path_of(std::min(depth + 1, stack.size()), kNoEdge);
    return Error(ErrorCode::kCycle, path_of(stack.size(), edge),
                 python_type_name(module) + " is its own ancestor (already at '" +
                     (ancestor.empty() ? "<root>" : ancestor) + "')");
  };
  // Follows wrappers from `module` along `edge` (kNoEdge for the root), extending its `via`.
  auto resolve = [&](ModulePtr module, size_t edge) {
    while (true) {
      const WrapperKind* kind = see_through ? see_through(*module) : nullptr;
      if (!kind) return module;
      if (auto depth = wrappers_on_path.find(module.get())) throw cycle(*module, *depth, edge);
      if (auto stray = stray_state(*module, *kind)) {
        throw Error(ErrorCode::kWrapperState, join_path(path_of(stack.size(), edge), stray->name),
                    kind->name + " holds a " + stray->what + " outside its slot '" + kind->slot +
                        "', and its kind does not declare it as state of its own");
      }
      wrappers_on_path.push(module.get(), stack.size());
      auto inner = kind->inner ? kind->inner(*module) : find_child(*module, kind->slot);
      slots.push_back(storage->text.copy(kind->slot));
      ++(edge == kNoEdge ? root_slots : slots_of[edge]).count;
      if (!inner) {
        throw Error(ErrorCode::kEmptySlot, path_of(stack.size(), edge),
                    kind->name + " has no module in its slot");
      }
      module = std::move(inner);
    }
  };
  auto push = [&](ModulePtr module, size_t edge, size_t wrappers_begin) {
    const size_t node = view.nodes_.size();
    index.emplace(module.get(), node);
    indexed.push_back(module.get());
    depth_of.push_back(stack.size());
    const ChildTable& children = child_table(*module);
    // The children are met next: ask memory for them now, not one at a time as the walk
    // reaches each (their objects are scattered over the heap).
    for (const auto& item : children) {
      if (const auto* child = item.value().get()) {
        __builtin_prefetch(child);
        __builtin_prefetch(&child_table(*child));
      }
    }
    edges_of.push_back(Span{edges.size(), 0});
    edges.resize(edges.size() + children.size());
    slots_of.resize(edges.size());
    view.nodes_.push_back(Node{std::move(module), {}});
    stack.push_back(Frame{node, edge, &children, 0, wrappers_begin});
  };

  root_slots.first = slots.size();
  push(resolve(root, kNoEdge), kNoEdge, 0);
  while (!stack.empty()) {
    Frame& frame = stack.back();
    if (frame.next == frame.children->size()) {
      wrappers_on_path.truncate(frame.wrappers_begin);
      depth_of[frame.node] = kNotOnPath;
      stack.pop_back();
      continue;
    }
    const auto& item = (*frame.children)[frame.next++];
    if (!item.value()) continue;
    const size_t edge = edges_of[frame.node].first + edges_of[frame.node].count++;
    edges[edge].name = storage->text.copy(item.key());
    slots_of[edge].first = slots.size();
    const size_t wrappers_begin = wrappers_on_path.size();
    auto module = resolve(item.value(), edge);
    if (auto it = index.find(module.get()); it != index.end()) {
      if (depth_of[it->second] != kNotOnPath) throw cycle(*module, depth_of[it->second], edge);
      wrappers_on_path.truncate(wrappers_begin);  // shared: already viewed elsewhere
      edges[edge].node = it->second;
      continue;
    }
    edges[edge].node = view.nodes_.size();
    push(std::move(module), edge, wrappers_begin);  // invalidates `frame`
  }

  // The arrays are whole: spans become views.
  const c10::ArrayRef<std::string_view> all_slots(slots);
  for (size_t e = 0; e < edges.size(); ++e) {
    edges[e].via = all_slots.slice(slots_of[e].first, slots_of[e].count);
  }
  for (size_t n = 0; n < view.nodes_.size(); ++n) {
    view.nodes_[n].children =
        c10::ArrayRef<Edge>(edges).slice(edges_of[n].first, edges_of[n].count);
  }
  view.root_via_ = all_slots.slice(root_slots.first, root_slots.count);
  last_sizes = {view.nodes_.size(), edges.size(), slots.size()};
  view.storage_ = std::move(storage);
  return view;
}

void ModuleView::check_path_count() const {
  // Paths to each node, in topological order (the view has no cycles), saturating.
  const size_t n = nodes_.size();
  std::vector<size_t> indegree(n, 0);
  for (const auto& node : nodes_) {
    for (const auto& edge : node.children) ++indegree[edge.node];
  }
  std::vector<uint64_t> paths(n, 0);
  std::vector<std::pair<size_t, const Edge*>> first_parent(n, {0, nullptr});
  std::vector<size_t> ready{0};
  paths[0] = 1;
  uint64_t visits = 0;
  size_t most = 0;
  while (!ready.empty()) {
    const size_t index = ready.back();
    ready.pop_back();
    visits = std::min(visits + paths[index], kMaxVisits + 1);
    if (paths[index] > paths[most]) most = index;
    for (const auto& edge : nodes_[index].children) {
      paths[edge.node] = std::min(paths[edge.node] + paths[index], kMaxVisits + 1);
      if (!first_parent[edge.node].second) first_parent[edge.node] = {index, &edge};
      if (--indegree[edge.node] == 0) ready.push_back(edge.node);
    }
  }
  if (visits <= kMaxVisits) return;
  std::vector<const std::string_view*> names;
  for (size_t at = most; first_parent[at].second; at = first_parent[at].first) {
    names.push_back(&first_parent[at].second->name);
  }
  std::string path;
  for (auto it = names.rbegin(); it != names.rend(); ++it) path = join_path(path, **it);
  throw Error(ErrorCode::kTooManyPaths, path,
              "this module is reached by " +
                  (paths[most] > kMaxVisits ? "more than " + std::to_string(kMaxVisits)
                                            : std::to_string(paths[most])) +
                  " paths; listing the state under every path would visit more than " +
                  std::to_string(kMaxVisits) + " modules");
}

void ModuleView::walk_state(const SeeThrough& is_wrapper, const StateFn& fn) const {
  check_path_count();
  // Keys are spelled into two buffers that grow and shrink with the path: no allocation per
  // module or tensor besides what `fn` keeps.
  std::string clean, wrapped;
  for (const auto slot : root_via_) wrapped.append(slot).push_back('.');
  struct Frame {
    size_t node;
    size_t next;
    size_t clean_size;    // the key prefix of this node's tensors: `clean` up to here
    size_t wrapped_size;  // and `wrapped` up to here
    bool through;
  };
  std::vector<Frame> stack;
  auto enter = [&](size_t index, bool through_above) {
    const torch::nn::Module& module = *nodes_[index].module;
    const bool through = through_above || (is_wrapper && is_wrapper(module) != nullptr);
    const size_t clean_size = clean.size();
    const size_t wrapped_size = wrapped.size();
    auto emit = [&](const std::string& name, const torch::Tensor& tensor) {
      clean.resize(clean_size);
      wrapped.resize(wrapped_size);
      fn(clean.append(name), wrapped.append(name), tensor, through);
    };
    for (const auto& p : detail::parameter_table(module)) {
      if (p.value().defined()) emit(p.key(), p.value());
    }
    if (show_held_) {
      for (const auto& [name, tensor] : detail::held_parameters(module)) emit(name, tensor);
    }
    for (const auto& b : detail::buffer_table(module)) {
      if (b.value().defined() && persistent(module, b.key())) emit(b.key(), b.value());
    }
    stack.push_back(Frame{index, 0, clean_size, wrapped_size, through});
  };
  enter(0, false);
  while (!stack.empty()) {
    Frame& frame = stack.back();
    const auto children = nodes_[frame.node].children;
    if (frame.next == children.size()) {
      stack.pop_back();
      continue;
    }
    const Edge& edge = children[frame.next++];
    clean.resize(frame.clean_size);
    wrapped.resize(frame.wrapped_size);
    clean.append(edge.name).push_back('.');
    wrapped.append(edge.name).push_back('.');
    for (const auto slot : edge.via) wrapped.append(slot).push_back('.');
    enter(edge.node, frame.through);  // invalidates `frame`
  }
}

void ModuleView::for_each_state(const std::function<void(const std::string&, const std::string&,
                                                         const torch::Tensor&)>& fn) const {
  walk_state(nullptr, [&fn](const std::string& clean, const std::string& wrapped,
                            const torch::Tensor& t, bool) { fn(clean, wrapped, t); });
}

StateDict ModuleView::state_through(const SeeThrough& is_wrapper) const {
  StateDict state;
  walk_state(is_wrapper, [&state](const std::string& key, const std::string&,
                                  const torch::Tensor& t, bool through) {
    if (through) state.insert(key, t);
  });
  return state;
}

StateDict ModuleView::state_dict() const {
  StateDict state;
  // Room for every tensor of every module once (a shared module's second path may grow it):
  // growing the dictionary's index step by step rehashes every key each time.
  size_t tensors = 0;
  for (const auto& node : nodes_) {
    tensors +=
        detail::parameter_table(*node.module).size() + detail::buffer_table(*node.module).size();
  }
  state.reserve(tensors);
  for_each_state([&state](const std::string& key, const std::string&, const torch::Tensor& t) {
    state.insert(key, t);
  });
  return state;
}

std::vector<std::string> ModuleView::module_paths() const {
  check_path_count();
  std::vector<std::string> paths;
  std::vector<std::pair<size_t, std::string>> stack{{0, ""}};
  while (!stack.empty()) {
    auto [node, path] = std::move(stack.back());
    stack.pop_back();
    const auto& children = nodes_[node].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      stack.emplace_back(it->node, join_path(path, it->name));
    }
    paths.push_back(std::move(path));
  }
  return paths;
}

}  // namespace wrapcert
