#include <wrapcert/certify/detail/quiet_check.h>
#include <wrapcert/certify/detail/training.h>
#include <wrapcert/certify/property_table.h>
#include <wrapcert/certify/ranks.h>
#include <wrapcert/detail/blame.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/io/detail/scratch.h>
#include <wrapcert/keys.h>
#include <wrapcert/process_group.h>
#include <wrapcert/sharding.h>
#include <wrapcert/state_dict.h>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace wrapcert::certify {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using props::Verdict;

const char* const kKeys = "P1 keys across ranks";
const char* const kValues = "P13 values across ranks";
const char* const kBackward = "P4 backward across ranks";
const char* const kRelease = "P14 release across ranks";
const char* const kRoundTrip = "P10 round trip across ranks";
const char* const kTraining = "P17 training across ranks";

Verdict fail(const std::string& property, std::string reason, std::string key = {}) {
  return Verdict{property, false, false, std::move(reason), std::move(key)};
}

/// `fn` on this rank, an exception a failed verdict naming who threw.
template <typename Fn>
Verdict guarded(const std::string& property, Fn&& fn) {
  (void)detail::take_blame();
  try {
    return fn();
  } catch (const Error& e) {
    const auto who = detail::take_blame();
    return fail(property, (who.empty() ? std::string("the wrapper") : who) + " threw: " + e.what(),
                e.key_path());
  } catch (const std::exception& e) {
    const auto who = detail::take_blame();
    std::string what = e.what();
    return fail(property, (who.empty() ? std::string("the wrapper") : who) +
                              " threw: " + what.substr(0, what.find('\n')));
  }
}

/// Every rank's verdict made one: passed when all passed, else the first failing rank's, naming
/// the rank unless every failing rank says the same. A collective.
Verdict agree(ProcessGroup& group, const Verdict& mine) {
  const json j = {{"p", mine.passed}, {"s", mine.skipped}, {"r", mine.reason}, {"k", mine.key}};
  const auto all = group.all_gather_text(j.dump());
  std::vector<std::pair<int, Verdict>> failed;
  bool skipped = false;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto v = json::parse(all[r]);
    Verdict verdict{mine.property, v["p"].get<bool>(), v["s"].get<bool>(),
                    v["r"].get<std::string>(), v["k"].get<std::string>()};
    if (!verdict.passed) failed.emplace_back(static_cast<int>(r), verdict);
    skipped = skipped || verdict.skipped;
  }
  if (failed.empty()) {
    Verdict out = mine;
    out.skipped = skipped;
    return out;
  }
  auto out = failed.front().second;
  const bool same = std::all_of(failed.begin(), failed.end(), [&](const auto& f) {
    return f.second.reason == out.reason && f.second.key == out.key;
  });
  if (!same || failed.size() < all.size()) {
    out.reason = "rank " + std::to_string(failed.front().first) + ": " + out.reason;
  }
  return out;
}

/// A spec with the certified kind at the root and, for kinds that nest, wherever the generator
/// put wrappers (FSDP's units); the others unwrapped.
void rewrap(gen::NodeSpec& node, const std::string& kind, bool nests, bool root) {
  if (root) {
    node.wrappers = {kind};
  } else if (!node.wrappers.empty()) {
    node.wrappers.clear();
    if (nests) node.wrappers.push_back(kind);
  }
  for (auto& child : node.children) rewrap(child.second, kind, nests, false);
}

/// One tensor of a rank's sharded state dict: whole (held by every rank) or a shard.
struct Held {
  std::string wrapped;  ///< its key in the wrapped model
  std::string clean;    ///< what that translates to
  bool sharded = false;
  bool parameter = true;  ///< not a buffer
  int64_t offset = 0;
  std::vector<int64_t> shape;
  torch::Tensor values;  ///< flat
  torch::Tensor grad;    ///< flat; undefined when none
};

std::string join(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

/// This rank's sharded state dict of the whole wrapped model: every `ShardedModule`'s local
/// shards, and the model's own state dict for what no wrapper shards (the wrappers' declared
/// state left out), each key translated.
std::vector<Held> held_state(const ModulePtr& root) {
  std::vector<Held> out;
  std::set<std::string> sharded, owned;
  for (const auto& [module, path] : module_paths(*root)) {
    auto* m = const_cast<torch::nn::Module*>(module);
    if (const auto* kind = Registry::global().find(*m)) {
      for (const auto& name : kind->owned_state) owned.insert(join(path, name));
    }
    if (auto* s = dynamic_cast<ShardedModule*>(m)) {
      for (auto& shard : s->local_shards()) {
        Held h;
        h.wrapped = join(path, shard.key);
        h.sharded = true;
        h.offset = shard.offset;
        h.shape = shard.shape;
        h.values = shard.values;
        h.grad = shard.grad;
        sharded.insert(h.wrapped);
        out.push_back(std::move(h));
      }
    }
  }
  const auto params = root->named_parameters(/*recurse=*/true);
  for (const auto& item : state_dict(root)) {
    if (owned.count(item.key()) || sharded.count(item.key())) continue;
    Held h;
    h.wrapped = item.key();
    h.shape = item.value().sizes().vec();
    h.values = item.value().detach().reshape(-1);
    const auto* p = params.find(item.key());
    h.parameter = p != nullptr;
    if (p && p->grad().defined()) h.grad = p->grad().reshape(-1);
    out.push_back(std::move(h));
  }
  const auto translator = KeyTranslator::from_tree(root);
  for (auto& h : out) {
    try {
      h.clean = translator.to_clean(h.wrapped);
    } catch (const Error&) {
      h.clean.clear();  // reported by the check, with the key
    }
  }
  return out;
}

/// The keys of `root`'s state dict that its wrappers declare as their own state (`owned_state`):
/// saved beside the model's, so every rank must save the same ones.
std::vector<std::string> owned_keys(const ModulePtr& root) {
  std::set<std::string> owned;
  for (const auto& [module, path] : module_paths(*root)) {
    if (const auto* kind = Registry::global().find(*module)) {
      for (const auto& name : kind->owned_state) owned.insert(join(path, name));
    }
  }
  std::vector<std::string> out;
  for (const auto& item : state_dict(root)) {
    if (owned.count(item.key())) out.push_back(item.key());
  }
  return out;
}

std::vector<double> doubles(const torch::Tensor& t) {
  const auto d = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

json to_json(const Held& h, bool values, bool grads) {
  json j = {{"w", h.wrapped}, {"c", h.clean},          {"s", h.sharded},  {"p", h.parameter},
            {"o", h.offset},  {"n", h.values.numel()}, {"shape", h.shape}};
  if (values) j["v"] = doubles(h.values);
  if (grads) j["g"] = h.grad.defined() ? json(doubles(h.grad)) : json(nullptr);
  return j;
}

/// Every rank's held state, in rank order (a collective).
std::vector<json> exchange(ProcessGroup& group, const std::vector<Held>& held, bool values,
                           bool grads, const std::string& error = {}) {
  json mine = json::array();
  for (const auto& h : held) mine.push_back(to_json(h, values, grads));
  const json message = {{"e", error}, {"h", mine}};
  std::vector<json> out;
  for (const auto& text : group.all_gather_text(message.dump())) out.push_back(json::parse(text));
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// Every rank's held state covers the model's keys exactly: each key whole on every rank, or
/// sharded with shards that tile it (no gap, no overlap, nothing past its end).
Verdict check_tiling(const std::string& property, const std::vector<json>& ranks,
                     const StateDict& model) {
  struct Tile {
    int rank;
    int64_t offset, count;
  };
  std::map<std::string, std::vector<Tile>> tiles;
  std::map<std::string, int> whole;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& h : ranks[r]["h"]) {
      const auto wrapped = h["w"].get<std::string>();
      const auto clean = h["c"].get<std::string>();
      if (clean.empty() || !model.contains(clean)) {
        return fail(property,
                    "rank " + std::to_string(r) + " holds '" + wrapped + "', which " +
                        (clean.empty() ? std::string("has no key in the model")
                                       : "translates to '" + clean + "', not a key of the model"),
                    wrapped);
      }
      const auto shape = h["shape"].get<std::vector<int64_t>>();
      if (shape != model[clean].sizes().vec()) {
        return fail(property,
                    "rank " + std::to_string(r) + " gives '" + clean + "' the shape " +
                        shape_text(shape) + ", the model " + shape_text(model[clean].sizes().vec()),
                    clean);
      }
      if (h["s"].get<bool>()) {
        tiles[clean].push_back({static_cast<int>(r), h["o"].get<int64_t>(), h["n"].get<int64_t>()});
      } else {
        ++whole[clean];
      }
    }
  }
  const int world = static_cast<int>(ranks.size());
  for (const auto& item : model) {
    const auto& key = item.key();
    const auto t = tiles.find(key);
    const auto w = whole.find(key);
    if (t == tiles.end() && w == whole.end()) {
      return fail(property, "no rank holds '" + key + "'", key);
    }
    if (t != tiles.end() && w != whole.end()) {
      return fail(property, "'" + key + "' is held whole on some ranks and sharded on others", key);
    }
    if (w != whole.end()) {
      if (w->second != world) {
        return fail(property,
                    "'" + key + "' is whole on " + std::to_string(w->second) + " of " +
                        std::to_string(world) + " ranks and on no other",
                    key);
      }
      continue;
    }
    auto shards = t->second;
    std::sort(shards.begin(), shards.end(),
              [](const Tile& a, const Tile& b) { return a.offset < b.offset; });
    const auto numel = item.value().numel();
    int64_t at = 0;
    for (const auto& s : shards) {
      if (s.offset != at) {
        return fail(property,
                    "the shards of '" + key + "' do not tile it: rank " + std::to_string(s.rank) +
                        "'s starts at element " + std::to_string(s.offset) + ", expected " +
                        std::to_string(at) + (s.offset > at ? " (a gap)" : " (an overlap)"),
                    key);
      }
      at += s.count;
    }
    if (at != numel) {
      return fail(property,
                  "the shards of '" + key + "' end at element " + std::to_string(at) + " of " +
                      std::to_string(numel),
                  key);
    }
  }
  return Verdict{property, true, false, {}, {}};
}

/// The full state dict every sharding wrapper gathers to rank 0, with the whole tensors of the
/// rest, translated (a collective). Empty on the other ranks, except for what a wrapper wrongly
/// gave them (`stray`).
StateDict full_state(const ModulePtr& root, ProcessGroup& group, std::string& stray) {
  StateDict out;
  const auto translator = KeyTranslator::from_tree(root);
  for (const auto& [module, path] : module_paths(*root)) {
    auto* m = const_cast<torch::nn::Module*>(module);
    if (auto* s = dynamic_cast<ShardedModule*>(m)) {
      for (auto& [key, tensor] : s->full_state_dict(0)) {
        const auto wrapped = join(path, key);
        if (group.rank() != 0) {
          if (stray.empty()) stray = wrapped;
          continue;
        }
        out.insert(translator.to_clean(wrapped), tensor);
      }
    }
  }
  return out;
}

/// The single-process reference: the plain model's gradients (by key) on `input`, optionally
/// computed in `compute` (the model cast, the output cast back), as the wrappers do.
std::map<std::string, torch::Tensor> reference_grads(const gen::TreeSpec& spec,
                                                     const torch::Tensor& input,
                                                     std::optional<c10::ScalarType> compute) {
  const auto plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
  const auto dtype = input.scalar_type();
  if (compute) plain.root->to(*compute);  // parameters and buffers, as the wrappers cast them
  auto out = call(*plain.root, compute ? input.to(*compute) : input).to(dtype);
  if (!out.requires_grad()) return {};
  out.pow(2).sum().backward();
  std::map<std::string, torch::Tensor> grads;
  const auto params = plain.root->named_parameters(/*recurse=*/true);
  for (const auto& item : plain.original) {
    if (const auto* p = params.find(item.key()); p && p->grad().defined()) {
      grads[item.key()] = p->grad().to(dtype).reshape(-1);
    }
  }
  return grads;
}

/// Every rank's gradient of each parameter, assembled whole from the shards; `missing` gets the
/// keys some rank has no gradient for.
std::map<std::string, torch::Tensor> gathered_grads(const std::vector<json>& ranks,
                                                    const StateDict& model,
                                                    std::map<std::string, int>& missing) {
  std::map<std::string, torch::Tensor> out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& h : ranks[r]["h"]) {
      const auto clean = h["c"].get<std::string>();
      if (!model.contains(clean) || !h["p"].get<bool>()) continue;
      if (h["g"].is_null()) {
        missing.emplace(clean, static_cast<int>(r));
        continue;
      }
      const bool sharded = h["s"].get<bool>();
      if (!sharded && r > 0) continue;  // whole on every rank: rank 0's
      auto& whole = out[clean];
      if (!whole.defined()) whole = torch::zeros({model[clean].numel()}, torch::kDouble);
      const auto g = h["g"].get<std::vector<double>>();
      const auto offset = sharded ? h["o"].get<int64_t>() : 0;
      if (offset + static_cast<int64_t>(g.size()) > whole.numel()) continue;  // tiling says why
      whole.narrow(0, offset, static_cast<int64_t>(g.size()))
          .copy_(torch::tensor(g, torch::kDouble));
    }
  }
  return out;
}

/// Whether `got` is within `tolerance` (relative, with the same absolute floor) of `want`;
/// `at` is the largest difference.
bool within(const torch::Tensor& got, const torch::Tensor& want, double tolerance, double& at) {
  const auto diff = (got - want).abs();
  at = diff.numel() ? diff.max().item<double>() : 0.0;
  return diff.le(tolerance * (want.abs() + 1.0)).all().item<bool>();
}

struct Case {
  const std::string& kind;
  const KindRef& ref;
  ProcessGroup& group;
  int batch = 1;      ///< examples per rank
  uint64_t draw = 0;  ///< the input's seed
};

/// Agrees on `local`, then exchanges every rank's held state (with gradients when `grads`) and
/// checks that it tiles the model (the same data on every rank, so the same verdict: no need to
/// agree again). The verdict to stop at, else nullopt with `ranks` filled.
std::optional<Verdict> agree_and_tile(const std::string& property, ProcessGroup& group,
                                      const Verdict& local, const std::vector<Held>& held,
                                      bool grads, const StateDict& model,
                                      std::vector<json>& ranks) {
  auto agreed = agree(group, local);
  if (!agreed.passed || agreed.skipped) return agreed;
  ranks = exchange(group, held, false, grads);
  auto tiling = check_tiling(property, ranks, model);
  if (!tiling.passed) return tiling;
  return std::nullopt;
}

Verdict keys_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kKeys;
  std::vector<Held> held;
  std::string error;
  StateDict model;
  std::vector<std::string> owned;
  Verdict local = guarded(property, [&] {
    const auto built = gen::build(spec);
    model = built.original;
    held = held_state(built.root);
    owned = owned_keys(built.root);
    for (const auto& h : held) {
      if (h.clean.empty())
        return fail(property, "'" + h.wrapped + "' has no key in the model", h.wrapped);
    }
    return Verdict{property, true, false, {}, {}};
  });
  std::vector<json> ranks;
  if (auto stop = agree_and_tile(property, c.group, local, held, false, model, ranks)) {
    return *stop;
  }
  // The wrappers' declared state is saved beside the model's: every rank saves the same keys of
  // it, or the ranks' checkpoints disagree (a key on one rank alone). Every rank sees every
  // rank's list, so all of them judge alike.
  Verdict same_owned{property, true, false, {}, {}};
  {
    const auto lists = c.group.all_gather_text(json(owned).dump());
    const auto first = json::parse(lists.at(0)).get<std::vector<std::string>>();
    for (size_t r = 1; r < lists.size() && same_owned.passed; ++r) {
      const auto other = json::parse(lists[r]).get<std::vector<std::string>>();
      for (const auto& key : other) {
        if (std::find(first.begin(), first.end(), key) == first.end()) {
          same_owned = fail(property,
                            "rank " + std::to_string(r) + " saves the wrapper state '" + key +
                                "', which rank 0 does not: the ranks' checkpoints disagree",
                            key);
          break;
        }
      }
      for (const auto& key : first) {
        if (!same_owned.passed) break;
        if (std::find(other.begin(), other.end(), key) == other.end()) {
          same_owned = fail(property,
                            "rank 0 saves the wrapper state '" + key + "', which rank " +
                                std::to_string(r) + " does not: the ranks' checkpoints disagree",
                            key);
        }
      }
    }
  }
  if (!same_owned.passed) return same_owned;  // alike on every rank: no collective is left out
  // The full state dict on rank 0 holds every key the ranks shard.
  local = guarded(property, [&] {
    const auto built = gen::build(spec);
    std::string stray;
    const auto full = full_state(built.root, c.group, stray);
    if (!stray.empty()) {
      return fail(property,
                  "the full state dict was gathered to rank " + std::to_string(c.group.rank()) +
                      ", not rank 0 ('" + stray + "')",
                  stray);
    }
    if (c.group.rank() != 0) return Verdict{property, true, false, {}, {}};
    for (const auto& item : model) {
      const bool whole_here = std::any_of(held.begin(), held.end(), [&](const Held& h) {
        return !h.sharded && h.clean == item.key();
      });
      if (!whole_here && !full.contains(item.key())) {
        return fail(property, "the full state dict on rank 0 lacks '" + item.key() + "'",
                    item.key());
      }
    }
    return Verdict{property, true, false, {}, {}};
  });
  return agree(c.group, local);
}

Verdict values_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kValues;
  gen::Built built;
  std::optional<gen::Built> plain;
  const auto agreed = agree(c.group, guarded(property, [&] {
                              built = gen::build(spec);
                              plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
                              return Verdict{property, true, false, {}, {}};
                            }));
  if (!agreed.passed) return agreed;
  // This rank's shards (no collective: a failure here must not leave the others waiting).
  auto local = guarded(property, [&] {
    for (const auto& h : held_state(built.root)) {
      if (h.clean.empty() || !plain->original.contains(h.clean)) continue;  // P1's to report
      const auto want = plain->original[h.clean].detach().reshape(-1);
      if (h.offset + h.values.numel() > want.numel() ||
          !h.values.equal(want.narrow(0, h.offset, h.values.numel()))) {
        return fail(property,
                    "this rank's " + std::string(h.sharded ? "shard" : "tensor") + " of '" +
                        h.clean + "' (elements " + std::to_string(h.offset) + " to " +
                        std::to_string(h.offset + h.values.numel()) +
                        ") is not the model's values there",
                    h.clean);
      }
    }
    return Verdict{property, true, false, {}, {}};
  });
  // The full state dict, gathered on every rank alike.
  const auto gathered = guarded(property, [&] {
    std::string stray;
    const auto full = full_state(built.root, c.group, stray);
    for (const auto& item : full) {
      const auto* want = plain->original.find(item.key());
      if (want && !item.value().equal(*want)) {
        return fail(property, "the gathered '" + item.key() + "' is not the model's values",
                    item.key());
      }
    }
    return Verdict{property, true, false, {}, {}};
  });
  return agree(c.group, local.passed ? gathered : local);
}

Verdict backward_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kBackward;
  const auto& across = c.ref.ranks();
  const int world = c.group.size();
  const auto dtype = gen::scalar_type(spec.dtype);
  std::vector<Held> held;
  StateDict model;
  std::map<std::string, torch::Tensor> mine_ref;  // this rank's slice, the plain model
  torch::Tensor global;
  auto local = guarded(property, [&] {
    const auto built = gen::build(spec);
    model = built.original;
    global = gen::sample_input(spec, dtype, c.draw, static_cast<int64_t>(c.batch) * world);
    const auto slice = global.narrow(0, static_cast<int64_t>(c.batch) * c.group.rank(), c.batch);
    for (auto& p : built.root->parameters(/*recurse=*/true)) p.mutable_grad() = torch::Tensor();
    auto out = call(*built.root, slice);
    if (!out.requires_grad()) return Verdict{property, true, true, "no parameters", {}};
    out.pow(2).sum().backward();
    held = held_state(built.root);
    mine_ref = reference_grads(spec, slice, across.compute_dtype);
    return Verdict{property, true, false, {}, {}};
  });
  std::vector<json> ranks;
  if (auto stop = agree_and_tile(property, c.group, local, held, true, model, ranks)) {
    return *stop;
  }
  std::map<std::string, int> missing;
  const auto got = gathered_grads(ranks, model, missing);
  // Every rank's own gradient of its slice (the plain model), for the exact reduction.
  json mine = json::object();
  for (const auto& [key, g] : mine_ref) mine[key] = doubles(g);
  const auto all_refs = c.group.all_gather_text(mine.dump());
  std::map<std::string, torch::Tensor> reduced;  // in double: the exact sum or mean
  for (const auto& text : all_refs) {
    const auto refs = json::parse(text);
    for (auto it = refs.begin(); it != refs.end(); ++it) {
      auto g = torch::tensor(it.value().get<std::vector<double>>(), torch::kDouble);
      auto& sum = reduced[it.key()];
      sum = sum.defined() ? sum + g : g;
    }
  }
  const bool mean = across.reduction == GradientReduction::kMean;
  // Tolerances, in machine epsilons of the dtype reduced in: the reduction of `world` values
  // rounds once per addition and once for the division.
  const auto reduce_dtype = across.compute_dtype ? torch::kFloat : dtype;
  const double reduce_eps =
      gen::epsilon(reduce_dtype == torch::kFloat ? gen::Dtype::kFloat32 : spec.dtype);
  const double exact_tol = 2.0 * (world + 1) * reduce_eps;
  auto local_verdict = [&]() -> Verdict {
    for (const auto& item : model) {
      const auto& key = item.key();
      const auto ref = reduced.find(key);
      const auto g = got.find(key);
      if (ref == reduced.end()) continue;  // no gradient in the model either (unused)
      if (const auto m = missing.find(key); m != missing.end()) {
        return fail(property,
                    "no gradient reached rank " + std::to_string(m->second) + "'s '" + key + "'",
                    key);
      }
      if (g == got.end()) return fail(property, "no gradient reached '" + key + "'", key);
      // The rounding of the exact mean (or sum) to the dtype the model's gradient is in.
      const auto want = (mean ? ref->second / world : ref->second).to(dtype).to(torch::kDouble);
      double at = 0;
      if (!within(g->second, want, exact_tol, at)) {
        return fail(property,
                    "the gradient of '" + key + "' is not the " + (mean ? "mean" : "sum") +
                        " over the ranks of their own gradients " + "(largest difference " +
                        std::to_string(at) + ")",
                    key);
      }
    }
    // The whole batch in one process: the same gradients (averaged over ranks: the mean of the
    // slices' sums is the whole batch's sum over the world size). In float64 and float32 the
    // slices and the whole batch differ only in the order of a sum over examples; bfloat16 and
    // float16 round at other places, and mixed precision computes in bfloat16: those rows hold
    // to the exact reduction above alone.
    if (!across.compute_dtype && (dtype == torch::kDouble || dtype == torch::kFloat)) {
      const auto whole = reference_grads(spec, global, std::nullopt);
      const double whole_tol = 64.0 * gen::epsilon(spec.dtype) * c.batch * world;
      for (const auto& [key, w] : whole) {
        const auto g = got.find(key);
        if (g == got.end()) continue;
        const auto want = (mean ? w.to(torch::kDouble) / world : w.to(torch::kDouble));
        double at = 0;
        if (!within(g->second, want, whole_tol, at)) {
          return fail(property,
                      "the gradient of '" + key +
                          "' differs from one process's on the whole "
                          "batch (largest difference " +
                          std::to_string(at) + ")",
                      key);
        }
      }
    }
    return Verdict{property, true, false, {}, {}};
  };
  return agree(c.group, guarded(property, local_verdict));
}

Verdict release_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kRelease;
  const double delta = 0.125;
  std::vector<std::string> released;  // this rank's state-dict keys once released
  std::vector<Held> held;
  StateDict model;
  gen::Built built;
  auto local = guarded(property, [&] {
    built = gen::build(spec);
    model = built.original;
    held = held_state(built.root);
    // Each rank moves its own shards by (rank + 1) / 8, as an optimizer step would: release
    // must gather every rank's values, each into its place.
    std::set<const void*> moved;
    torch::NoGradGuard no_grad;
    for (auto& h : held) {
      if (!h.sharded) continue;
      const auto* at = static_cast<const char*>(h.values.data_ptr());
      if (!moved.insert(at).second) continue;
      h.values.add_(delta * (c.group.rank() + 1));
    }
    return Verdict{property, true, false, {}, {}};
  });
  std::vector<json> ranks;
  if (auto stop = agree_and_tile(property, c.group, local, held, false, model, ranks)) {
    return *stop;
  }
  local = guarded(property, [&]() -> Verdict {
    const auto plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
    // What each tensor must hold: the model's values, each shard moved by its rank's step.
    std::map<std::string, torch::Tensor> expected;
    for (const auto& item : plain.original) {
      expected[item.key()] = item.value().detach().clone().reshape(-1);
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (const auto& h : ranks[r]["h"]) {
        if (!h["s"].get<bool>()) continue;
        auto& e = expected[h["c"].get<std::string>()];
        e.narrow(0, h["o"].get<int64_t>(), h["n"].get<int64_t>())
            .add_(delta * static_cast<double>(r + 1));
      }
    }
    for (auto it = built.wrappers.rbegin(); it != built.wrappers.rend(); ++it) {
      if (const auto* kind = Registry::global().find(**it); kind && kind->release) {
        (void)kind->release(**it);
      }
    }
    const auto translator = KeyTranslator::from_tree(built.root);
    const auto state = state_dict(built.root);
    released = state.keys();
    for (const auto& item : state) {
      std::string clean;
      try {
        clean = translator.to_clean(item.key());
      } catch (const Error&) {
        continue;  // a wrapper's own state
      }
      if (!model.contains(clean)) continue;
      if (!item.value().is_same(model[clean])) {
        return fail(property, "'" + clean + "' is not the model's own tensor after release", clean);
      }
      if (!item.value().detach().reshape(-1).equal(expected.at(clean))) {
        return fail(property,
                    "'" + clean + "' after release is not every rank's values, each in its place",
                    clean);
      }
    }
    for (const auto& item : model) {
      bool found = false;
      for (const auto& s : state) found = found || s.value().is_same(item.value());
      if (!found)
        return fail(property, "'" + item.key() + "' is missing after release", item.key());
    }
    return Verdict{property, true, false, {}, {}};
  });
  // What each rank would save once released: the same keys on every rank (every rank gathers,
  // whatever its own verdict, so that none waits).
  const auto lists = c.group.all_gather_text(json(released).dump());
  if (local.passed) {
    const auto first = json::parse(lists.at(0)).get<std::vector<std::string>>();
    for (size_t r = 1; r < lists.size() && local.passed; ++r) {
      const auto other = json::parse(lists[r]).get<std::vector<std::string>>();
      if (other == first) continue;
      std::string key, where;
      for (const auto& k : other) {
        if (std::find(first.begin(), first.end(), k) == first.end()) {
          key = k;
          where = "rank " + std::to_string(r) + " saves '" + k + "' after release, rank 0 does not";
          break;
        }
      }
      for (const auto& k : first) {
        if (!key.empty()) break;
        if (std::find(other.begin(), other.end(), k) == other.end()) {
          key = k;
          where = "rank 0 saves '" + k + "' after release, rank " + std::to_string(r) + " does not";
        }
      }
      if (key.empty()) where = "rank " + std::to_string(r) + " saves the keys in another order";
      local = fail(property, "the ranks' released state dicts differ: " + where, key);
    }
  }
  return agree(c.group, local);
}

/// This rank's file of a sharded save, written and read back: every shard it holds (the whole
/// tensors from rank 0 alone), named by number, and its part of the index.
std::string save_shards(const std::vector<Held>& held, int rank, json& index) {
  torch::serialize::OutputArchive archive;
  int n = 0;
  for (const auto& h : held) {
    if (!h.sharded && rank != 0) continue;
    const auto name = "t" + std::to_string(n++);
    archive.write(name, h.values.detach().clone());
    index.push_back(
        {{"key", h.clean}, {"offset", h.offset}, {"numel", h.values.numel()}, {"name", name}});
  }
  const detail::ScratchFolder folder("wrapcert-save");
  const auto file =
      std::filesystem::path(folder.path()) / ("shard-" + std::to_string(rank) + ".pt");
  archive.save_to(file.string());
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Verdict round_trip_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kRoundTrip;
  json index = json::array();
  std::string file;
  auto agreed = agree(c.group, guarded(property, [&] {
                        const auto built = gen::build(spec);
                        file = save_shards(held_state(built.root), c.group.rank(), index);
                        return Verdict{property, true, false, {}, {}};
                      }));
  if (!agreed.passed) return agreed;
  // The index and every rank's file, as a file system shared by the ranks shows them.
  const auto indexes = c.group.all_gather_text(index.dump());
  const auto files = c.group.all_gather_text(file);
  const int world = c.group.size();
  const int other = world >= 4 && world % 2 == 0 ? world / 2 : world + 1;
  auto local = guarded(property, [&]() -> Verdict {
    const auto plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
    std::map<std::string, torch::Tensor> loaded, covered;
    for (size_t r = 0; r < files.size(); ++r) {
      std::istringstream stream(files[r]);
      torch::serialize::InputArchive archive;
      archive.load_from(stream);
      for (const auto& item : json::parse(indexes[r])) {
        const auto key = item["key"].get<std::string>();
        const auto* want = plain.original.find(key);
        if (!want) continue;  // P1's to report
        torch::Tensor t;
        archive.read(item["name"].get<std::string>(), t);
        const auto offset = item["offset"].get<int64_t>();
        const auto numel = item["numel"].get<int64_t>();
        auto& whole = loaded[key];
        auto& mask = covered[key];
        if (!whole.defined()) {
          whole = torch::zeros({want->numel()}, want->options());
          mask = torch::zeros({want->numel()}, torch::kBool);
        }
        if (offset + numel > whole.numel() || t.numel() != numel) {
          return fail(property,
                      "rank " + std::to_string(r) + "'s file holds elements " +
                          std::to_string(offset) + " to " + std::to_string(offset + numel) +
                          " of '" + key + "', which has " + std::to_string(whole.numel()),
                      key);
        }
        whole.narrow(0, offset, numel).copy_(t.reshape(-1));
        mask.narrow(0, offset, numel).fill_(true);
      }
    }
    // Every rank of the other world takes its rows of each tensor; this rank checks its share.
    for (int m = c.group.rank(); m < other; m += world) {
      for (const auto& item : plain.original) {
        const auto& key = item.key();
        const auto& want = item.value();
        const auto rows = want.dim() == 0 ? int64_t{1} : want.size(0);
        const auto row = rows == 0 ? int64_t{0} : want.numel() / rows;
        const auto shard = RowShard::of(rows, m, other);
        const auto begin = shard.begin() * row, count = (shard.end() - shard.begin()) * row;
        if (count == 0) continue;
        const auto it = loaded.find(key);
        if (it == loaded.end() || !covered[key].narrow(0, begin, count).all().item<bool>()) {
          return fail(property,
                      "loaded at world size " + std::to_string(other) + ", rank " +
                          std::to_string(m) + " finds elements of '" + key + "' (" +
                          std::to_string(begin) + " to " + std::to_string(begin + count) +
                          ") in no file",
                      key);
        }
        if (!it->second.narrow(0, begin, count)
                 .equal(want.detach().reshape(-1).narrow(0, begin, count))) {
          return fail(property,
                      "loaded at world size " + std::to_string(other) + ", rank " +
                          std::to_string(m) + "'s rows of '" + key + "' are not the model's",
                      key);
        }
      }
    }
    return Verdict{property, true, false, {}, {}};
  });
  return agree(c.group, local);
}

/// The training loop across ranks: every rank trains its wrapped model on its slice of each
/// batch with its own optimizer over what it holds (its shards), and one process trains the plain
/// model on the whole batch with the kind's reduction (a mean over ranks: the loss divided by
/// the world size). Every rank computes that reference itself (the same on each), so each judges
/// its own output rows, gradients, shards, modes and frozen parameters after every step, and the
/// ranks agree after every step (none left waiting in a collective). Then rank 0's full state
/// dict, the checkpoint a trainer writes, holds the trained values.
Verdict training_across_ranks(const gen::TreeSpec& spec, const Case& c) {
  const std::string property = kTraining;
  const auto& across = c.ref.ranks();
  const int world = c.group.size();
  const int rank = c.group.rank();
  const auto dtype = gen::scalar_type(spec.dtype);
  if (across.compute_dtype) {
    return Verdict{property,
                   true,
                   true,
                   "mixed precision computes in another dtype than one process would: held to "
                   "P4's exact reduction across ranks",
                   {}};
  }
  if (dtype != torch::kDouble && dtype != torch::kFloat) {
    return Verdict{property,
                   true,
                   true,
                   std::string("in ") + gen::to_string(spec.dtype) +
                       " the ranks' slices and one process's whole batch round at other places",
                   {}};
  }
  const bool mean = across.reduction == GradientReduction::kMean;
  std::optional<gen::Built> wrapped, plain;
  std::unique_ptr<detail::Trainer> wrapped_optimizer, plain_optimizer;
  auto agreed = agree(c.group, guarded(property, [&] {
                        wrapped = gen::build(spec);
                        plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
                        if (wrapped->changes_output) {
                          return Verdict{property, true, true, "the kind changes outputs", {}};
                        }
                        // SGD: its step is linear in the gradient, so a gradient the reduction
                        // rounds otherwise moves a value by the learning rate times that
                        // rounding. Adam divides by a gradient's running magnitude: a gradient
                        // of 0 on one process and 1e-17 on a rank would move by the learning
                        // rate.
                        detail::note_blame("the wrapped model's parameters, given to SGD");
                        wrapped_optimizer = std::make_unique<detail::Trainer>(
                            gen::Optimizer::kSgdMomentum, detail::unique_parameters(wrapped->root));
                        (void)detail::take_blame();
                        plain_optimizer = std::make_unique<detail::Trainer>(
                            gen::Optimizer::kSgdMomentum, detail::unique_parameters(plain->root));
                        return Verdict{property, true, false, {}, {}};
                      }));
  if (!agreed.passed || agreed.skipped) return agreed;

  const double eps = gen::epsilon(spec.dtype);
  const auto steps = props::training_steps(c.batch);
  bool training = !spec.eval;
  int optimizer_steps = 0;
  std::string at;
  // The ranks agree once, at the end (each agreement is a round trip between them): a rank that
  // failed keeps its first failure and goes on entering the same collectives as the others
  // (forward, backward and the final gather), stepping nothing more.
  Verdict first{property, true, false, {}, {}};
  std::optional<Verdict> stop;  // the model's own training diverged: the same step on every rank
  // Within a tolerance that grows with the steps: a rank's slice and the whole batch sum over
  // examples in another order (P4's bound), and every step carries that rounding forward.
  auto tolerance = [&](int batch) {
    return 64.0 * eps * batch * world * (1 + 4 * optimizer_steps);
  };
  const auto translator_of = [&] { return KeyTranslator::from_tree(wrapped->root); };
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    if (s.what == props::TrainingStep::What::kSwitchMode) training = !training;
    at = "step " + std::to_string(i + 1) + " of " + std::to_string(steps.size()) + ", " +
         (s.what == props::TrainingStep::What::kTrain
              ? std::string("forward, backward and each rank's SGD step")
          : s.what == props::TrainingStep::What::kNoGrad
              ? std::string("a call under torch.no_grad()")
              : std::string(training ? "train()" : "eval()") +
                    " through the wrappers, then a call") +
         " in " + (training ? "training" : "eval") + " mode on " + std::to_string(s.batch) +
         (s.batch == 1 ? " example" : " examples") + " per rank";
    const auto global = gen::sample_input(spec, dtype, props::kTrainingInputSeed + c.draw * 8 + i,
                                          static_cast<int64_t>(s.batch) * world);
    const auto slice = global.narrow(0, static_cast<int64_t>(s.batch) * rank, s.batch);
    // One process on the whole batch first: the same on every rank whatever its wrapper did, so
    // that every rank stops at the same step where the model's own training diverges.
    torch::Tensor want;
    try {
      if (s.what == props::TrainingStep::What::kSwitchMode) plain->root->train(training);
      if (s.what == props::TrainingStep::What::kTrain) {
        for (auto& p : plain->root->parameters(/*recurse=*/true))
          p.mutable_grad() = torch::Tensor();
        want = call(*plain->root, global);
        if (want.requires_grad()) (mean ? want.pow(2).sum() / world : want.pow(2).sum()).backward();
      } else {
        std::optional<torch::NoGradGuard> no_grad;
        if (s.what == props::TrainingStep::What::kNoGrad) no_grad.emplace();
        want = call(*plain->root, global);
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      stop = Verdict{property,
                     true,
                     true,
                     at + ": the model itself threw: " + what.substr(0, what.find('\n')),
                     {}};
      break;
    }
    if (!detail::finite(want)) {
      stop = Verdict{property, true, true, "the model's training diverged (" + at + ")", {}};
      break;
    }
    auto local = guarded(property, [&]() -> Verdict {
      torch::Tensor got;
      try {
        if (s.what == props::TrainingStep::What::kSwitchMode) wrapped->root->train(training);
        if (s.what == props::TrainingStep::What::kTrain) {
          for (auto& p : wrapped->root->parameters(/*recurse=*/true))
            p.mutable_grad() = torch::Tensor();
          got = call(*wrapped->root, slice);
          if (got.requires_grad()) got.pow(2).sum().backward();
        } else {
          std::optional<torch::NoGradGuard> no_grad;
          if (s.what == props::TrainingStep::What::kNoGrad) no_grad.emplace();
          got = call(*wrapped->root, slice);
        }
      } catch (const std::exception& e) {
        const auto blamed = detail::take_blame();
        std::string what = e.what();
        return fail(property, at + ": " + (blamed.empty() ? std::string("the wrapper") : blamed) +
                                  " threw: " + what.substr(0, what.find('\n')));
      }
      if (!first.passed) return first;  // this rank only keeps up with the others' collectives
      const double tol = tolerance(s.batch);
      double largest = 0;
      const auto rows = want.detach().narrow(0, static_cast<int64_t>(s.batch) * rank, s.batch);
      if (got.sizes() != rows.sizes() ||
          !within(got.detach().to(torch::kDouble), rows.to(torch::kDouble), tol, largest)) {
        return fail(property, at +
                                  ": this rank's output differs from its rows of one process's "
                                  "output on the whole batch (largest difference " +
                                  std::to_string(largest) + ")");
      }
      if (const auto d = detail::mode_difference(wrapped->root, training)) {
        return fail(property, at + ": a module of the wrapped model is " + d->second,
                    d->first.empty() ? std::string("<root>") : d->first);
      }
      const auto params = plain->root->named_parameters(/*recurse=*/true);
      const auto translator = translator_of();
      for (const auto& item : wrapped->root->named_parameters(/*recurse=*/true)) {
        std::string clean;
        try {
          clean = translator.to_clean(item.key());
        } catch (const Error&) {
          continue;  // a parameter of the wrapper's own layout (a flat parameter)
        }
        const auto* want_p = params.find(clean);
        if (want_p && item.value().requires_grad() != want_p->requires_grad()) {
          return fail(property,
                      at + ": requires_grad is " +
                          (item.value().requires_grad() ? "True" : "False") + ", the model's " +
                          (want_p->requires_grad() ? "True" : "False"),
                      clean);
        }
      }
      for (const auto& h : held_state(wrapped->root)) {
        const auto* p = params.find(h.clean);
        if (h.clean.empty() || !plain->original.contains(h.clean)) continue;  // P1's to report
        const auto n = h.values.numel();
        if (s.what == props::TrainingStep::What::kTrain && p && p->grad().defined() &&
            h.parameter) {
          if (!h.grad.defined()) {
            return fail(property,
                        at + ": no gradient reached this rank's " + (h.sharded ? "shard" : "copy") +
                            " of '" + h.clean + "'",
                        h.clean);
          }
          const auto ref = p->grad().detach().reshape(-1).to(torch::kDouble);
          if (h.offset + n > ref.numel() ||
              !within(h.grad.to(torch::kDouble), ref.narrow(0, h.offset, n), tol, largest)) {
            return fail(property,
                        at + ": the gradient of this rank's " + (h.sharded ? "shard" : "copy") +
                            " of '" + h.clean + "' differs from one process's on the whole batch" +
                            (mean ? " (averaged over the ranks)" : "") + " (largest difference " +
                            std::to_string(largest) + ")",
                        h.clean);
          }
        }
      }
      return Verdict{property, true, false, {}, {}};
    });
    if (!local.passed && first.passed) first = local;
    if (s.what != props::TrainingStep::What::kTrain) continue;
    // One process steps the whole model (always: it stays the same on every rank); each rank
    // steps what it holds, until it failed.
    plain_optimizer->step();
    if (!first.passed) continue;
    local = guarded(property, [&]() -> Verdict {
      try {
        detail::note_blame("the SGD step over this rank's parameters of the wrapped model");
        wrapped_optimizer->step();
        (void)detail::take_blame();
      } catch (const std::exception& e) {
        const auto blamed = detail::take_blame();
        std::string what = e.what();
        return fail(property, at + ": " + (blamed.empty() ? std::string("the wrapper") : blamed) +
                                  " threw: " + what.substr(0, what.find('\n')));
      }
      ++optimizer_steps;
      const double tol = tolerance(s.batch);
      for (const auto& h : held_state(wrapped->root)) {
        if (h.clean.empty() || !plain->original.contains(h.clean)) continue;
        const auto want = plain->original[h.clean].detach().reshape(-1).to(torch::kDouble);
        const auto n = h.values.numel();
        double largest = 0;
        if (h.offset + n > want.numel() ||
            !within(h.values.to(torch::kDouble), want.narrow(0, h.offset, n), tol, largest)) {
          return fail(property,
                      at + ": after the step, this rank's " + (h.sharded ? "shard" : "copy") +
                          " of '" + h.clean + "' (elements " + std::to_string(h.offset) + " to " +
                          std::to_string(h.offset + n) +
                          ") differs from one process's training on the whole batch (largest "
                          "difference " +
                          std::to_string(largest) + ")",
                      h.clean);
        }
      }
      return Verdict{property, true, false, {}, {}};
    });
    if (!local.passed && first.passed) first = local;
  }
  if (stop) return agree(c.group, first.passed ? *stop : first);
  // The checkpoint a trainer writes after training: the full state dict on rank 0 holds the
  // trained values.
  at = "after the " + std::to_string(steps.size()) + " steps";
  auto saved = guarded(property, [&]() -> Verdict {
    std::string stray;
    const auto full = full_state(wrapped->root, c.group, stray);
    const double tol = tolerance(c.batch);
    for (const auto& item : full) {
      const auto* want = plain->original.find(item.key());
      if (!want) continue;  // P1's to report
      double largest = 0;
      if (item.value().sizes() != want->sizes() ||
          !within(item.value().detach().to(torch::kDouble), want->detach().to(torch::kDouble), tol,
                  largest)) {
        return fail(property,
                    at + ": the full state dict gathered on rank 0 holds other values of '" +
                        item.key() +
                        "' than the model trained on one process (largest difference " +
                        std::to_string(largest) + ")",
                    item.key());
      }
    }
    return Verdict{property, true, false, {}, {}};
  });
  return agree(c.group, first.passed ? saved : first);
}

Entry run_one(const std::string& kind, const std::string& property, const Options& options,
              ProcessGroup& group, std::optional<gen::Dtype> dtype) {
  Entry entry;
  entry.kind = kind;
  entry.property = property;
  entry.target = "generated trees, world size " + std::to_string(group.size());
  if (dtype) entry.dtype = gen::to_string(*dtype);
  const auto start = Clock::now();
  const auto ref = Registry::global().resolve(kind);
  const auto& across = ref.ranks();
  gen::GenOptions g;
  g.kinds = {kind};
  g.sharing = false;  // a tensor tied across units is not what sharding wrappers accept
  // What training varies, as on one process: widths, batch sizes (1 to 3 examples a rank),
  // frozen parameters, mode-dependent and LibTorch leaves, training and eval mode.
  g.eval_mode = true;
  if (dtype) g.dtypes = {*dtype};
  const bool sgd = property == kTraining;  // see `training_across_ranks`
  const auto trees =
      rc::gen::map(gen::trees(g), [kind, nests = across.nests, sgd](gen::TreeSpec s) {
        rewrap(s.root, kind, nests, true);
        if (sgd) s.optimizer = gen::Optimizer::kSgdMomentum;
        return s;
      });
  auto shrunk = std::make_shared<gen::TreeSpec>();
  auto verdict = std::make_shared<Verdict>();
  int runs = 0, exercised = 0, n = 0;
  Drawn drawn;       // what the exercised cases drew
  std::string lost;  // a collective that failed: the ranks can no longer agree on anything
  const auto result = detail::check_quietly(
      kind + "." + property, options.seed, options.cases, options.max_size, [&] {
        if (!lost.empty()) return;  // let rapidcheck end; the run ends below
        const auto spec = *trees;
        const int batch = *rc::gen::inRange(1, 4);
        Case c{kind, ref, group, batch, options.seed + static_cast<uint64_t>(++n)};
        group.mark(kind + " " + property + " case " + std::to_string(n));
        Verdict v;
        try {
          // What a rank does alone is judged inside (a verdict); what escapes is a collective.
          if (property == kKeys)
            v = keys_across_ranks(spec, c);
          else if (property == kValues)
            v = values_across_ranks(spec, c);
          else if (property == kBackward)
            v = backward_across_ranks(spec, c);
          else if (property == kRoundTrip)
            v = round_trip_across_ranks(spec, c);
          else if (property == kTraining)
            v = training_across_ranks(spec, c);
          else
            v = release_across_ranks(spec, c);
        } catch (const std::exception& e) {
          const std::string what = e.what();
          lost = what.substr(0, what.find('\n'));
          return;
        }
        ++runs;
        try {
          const auto built = gen::build(spec);
          if (!v.skipped &&
              std::find(built.kinds.begin(), built.kinds.end(), kind) != built.kinds.end()) {
            ++exercised;
            auto as_run = spec;  // each rank ran `batch` examples
            as_run.batch = batch;
            add_drawn(drawn, as_run, /*trains=*/property == kTraining, group.size());
          }
        } catch (const std::exception&) {
          (void)detail::take_blame();
        }
        if (!v.passed) {
          *shrunk = spec;
          *verdict = v;
        }
        RC_PRE(!v.skipped);
        RC_ASSERT(v.passed);
      });
  if (!lost.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "rank",
                "rank " + std::to_string(group.rank()) + " lost the other ranks in " + kind + " " +
                    property + " case " + std::to_string(n) + ": " + lost);
  }
  entry.cases = runs;
  entry.exercised = exercised;
  entry.drawn = drawn;
  entry.coverage = std::to_string(exercised) + " of " + std::to_string(runs) + " cases held " +
                   kind + " on " + std::to_string(group.size()) + " ranks";
  rc::detail::FailureResult failure;
  if (result.match(failure)) {
    entry.status = Status::kFailed;
    entry.reason = verdict->reason.empty() ? failure.description : verdict->reason;
    entry.key = verdict->key;
    entry.counterexample = gen::describe(*shrunk, verdict->key);
  } else if (exercised == 0) {
    entry.status = Status::kFailed;
    entry.reason = "not exercised: none of the " + std::to_string(runs) + " cases held a " + kind;
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

}  // namespace

const std::vector<std::string>& rank_properties() {
  static const std::vector<std::string> names{kKeys,     kValues,  kRoundTrip,
                                              kBackward, kRelease, kTraining};
  return names;
}

Report run_ranks(const Options& options, const std::shared_ptr<ProcessGroup>& group,
                 const Listener& listener) {
  if (options.seed == 0) {
    throw Error(ErrorCode::kInvalidArgument, "seed",
                "certification across ranks needs a seed (every rank draws the same trees)");
  }
  Report report;
  report.options = options;
  if (report.options.kinds.empty()) report.options.kinds = Registry::global().names_across_ranks();
  for (const auto& kind : report.options.kinds) {
    if (!Registry::global().resolve(kind).ranks().certify) {
      throw Error(ErrorCode::kInvalidArgument, kind,
                  kind +
                      " is not certified across ranks (its kind does not declare "
                      "ranks.certify)");
    }
  }
  ProcessGroup::set_default(group);
  auto wanted = [&](const std::string& property) {
    if (options.properties.empty()) return true;
    const auto number = property.substr(0, property.find(' '));
    return std::any_of(options.properties.begin(), options.properties.end(),
                       [&](const std::string& p) { return p == property || p == number; });
  };
  std::vector<gen::Dtype> dtypes = options.dtypes;
  if (dtypes.empty()) dtypes.assign(std::begin(gen::kAllDtypes), std::end(gen::kAllDtypes));
  for (const auto& kind : report.options.kinds) {
    for (const auto& property : rank_properties()) {
      if (!wanted(property)) continue;
      std::vector<std::optional<gen::Dtype>> rows{std::nullopt};
      if (property == kBackward) rows.assign(dtypes.begin(), dtypes.end());
      if (property == kTraining) {
        // Compared with one process on the whole batch: in float64 and float32 the two differ
        // only in the order of sums; below, they round at other places.
        rows.clear();
        for (const auto d : dtypes) {
          if (d == gen::Dtype::kFloat64 || d == gen::Dtype::kFloat32) rows.emplace_back(d);
        }
        std::string why;
        if (Registry::global().resolve(kind).ranks().compute_dtype) {
          why =
              "mixed precision computes in another dtype than one process would: held to P4's "
              "exact reduction across ranks";
        } else if (rows.empty()) {
          why =
              "trains in float64 and float32 only (the ranks' slices and one process's whole "
              "batch round at other places below); --dtypes gave neither";
        }
        if (!why.empty()) {
          Entry skipped;
          skipped.kind = kind;
          skipped.property = property;
          skipped.target = "generated trees, world size " + std::to_string(group->size());
          skipped.status = Status::kSkipped;
          skipped.reason = why;
          if (listener) listener(skipped, true);
          report.entries.push_back(std::move(skipped));
          continue;
        }
      }
      for (const auto& dtype : rows) {
        Entry blank;
        blank.kind = kind;
        blank.property = property;
        blank.target = "generated trees, world size " + std::to_string(group->size());
        if (dtype) blank.dtype = gen::to_string(*dtype);
        if (listener) listener(blank, false);
        auto entry = run_one(kind, property, options, *group, dtype);
        if (entry.status == Status::kFailed) {
          entry.replay =
              "wrapcert certify --world-size " + std::to_string(group->size()) + " --wrappers '" +
              kind + "' --properties " + property.substr(0, property.find(' ')) +
              (dtype ? std::string(" --dtypes ") + gen::to_string(*dtype) : "") + " --seed " +
              std::to_string(options.seed) + " --cases " + std::to_string(options.cases);
          for (const auto& plugin : options.plugins) entry.replay += " --plugin '" + plugin + "'";
        }
        if (listener) listener(entry, true);
        report.entries.push_back(std::move(entry));
      }
    }
  }
  ProcessGroup::set_default(nullptr);
  return report;
}

}  // namespace wrapcert::certify
