#include <wrapcert/certify/detail/quiet_check.h>
#include <wrapcert/certify/property_table.h>
#include <wrapcert/detail/path.h>
#include <wrapcert/error.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/process_group.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/python/certify_python.h>
#include <wrapcert/python/detail/worker.h>
#include <wrapcert/state_dict.h>

#include <rapidcheck.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>

namespace wrapcert::python {
namespace {

using certify::Entry;
using certify::Status;
using json = nlohmann::json;
using props::Verdict;
using Clock = std::chrono::steady_clock;

constexpr const char* kGenerated = "generated trees";

// ---------------------------------------------------------------------------------------------
// Specs as the worker reads them

const char* leaf_name(gen::Leaf leaf) {
  switch (leaf) {
    case gen::Leaf::kLinear:
      return "Linear";
    case gen::Leaf::kLinearNoBias:
      return "LinearNoBias";
    case gen::Leaf::kEmbedding:
      return "Embedding";
    case gen::Leaf::kLayerNorm:
      return "LayerNorm";
    case gen::Leaf::kRMSNorm:
      return "RMSNorm";
    case gen::Leaf::kBuffered:
      return "Buffered";
    case gen::Leaf::kTorchLinear:
      return "TorchLinear";  // nn.Linear in PyTorch, placed by the C++ builder's rules
    case gen::Leaf::kModeScale:
      return "ModeScale";
  }
  return "Linear";
}

const char* container_name(gen::Container c) {
  switch (c) {
    case gen::Container::kCustom:
      return "Custom";
    case gen::Container::kSequential:
      return "Sequential";
    case gen::Container::kModuleList:
      return "ModuleList";
    case gen::Container::kModuleDict:
      return "ModuleDict";
  }
  return "Custom";
}

json to_json(const gen::NodeSpec& n) {
  json j;
  j["wrappers"] = n.wrappers;
  switch (n.type) {
    case gen::NodeSpec::Type::kLeaf:
      j["type"] = "leaf";
      j["leaf"] = leaf_name(n.leaf);
      j["tie"] = n.tie;
      j["frozen"] = n.frozen;
      break;
    case gen::NodeSpec::Type::kShared:
      j["type"] = "shared";
      j["shared"] = n.shared;
      break;
    case gen::NodeSpec::Type::kContainer: {
      j["type"] = "container";
      j["container"] = container_name(n.container);
      json children = json::array();
      for (const auto& [name, child] : n.children) children.push_back({name, to_json(child)});
      j["children"] = std::move(children);
      break;
    }
  }
  return j;
}

json to_json(const gen::TreeSpec& spec) {
  return {{"dim", spec.dim},
          {"batch", spec.batch},
          {"eval", spec.eval},
          {"dtype", gen::to_string(spec.dtype)},
          {"root", to_json(spec.root)}};
}

/// What the worker needs to run the training loop (P17) on a tree: the table's steps and the
/// optimizer's settings.
json training_fields(const gen::TreeSpec& spec) {
  json steps = json::array();
  for (const auto& s : props::training_steps(spec.batch)) {
    steps.push_back({props::to_string(s.what), s.batch});
  }
  return {{"steps", std::move(steps)},
          {"optimizer", spec.optimizer == gen::Optimizer::kAdam ? "adam" : "sgd"},
          {"rate", props::kTrainingLearningRate},
          {"momentum", props::kTrainingMomentum},
          {"input_seed", props::kTrainingInputSeed},
          {"probe_seed", props::kTrainingProbeSeed},
          {"fresh_seed", props::kTrainingFreshSeed}};
}

bool has_wrappers(const gen::NodeSpec& n) {
  if (!n.wrappers.empty()) return true;
  for (const auto& c : n.children) {
    if (has_wrappers(c.second)) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// One case as the worker saw it

/// The worker's reply to a case, or the fault that stood in for one. Across ranks: rank 0's
/// reply (or the first rank's fault, named), every rank's case, and what the ranks disagreed on.
struct Observed {
  Reply reply;
  std::vector<json> ranks;   ///< every rank's "case", when all ranks ran it (world size > 1)
  std::string disagreement;  ///< how one rank's reply differs from rank 0's, when it does
  bool ok() const {
    return reply.fault == Fault::kNone && disagreement.empty() && reply.body.value("ok", false);
  }
  const json& data() const { return reply.body.at("case"); }
  /// A field of a reply that says what was raised; empty after a fault.
  std::string field(const char* name) const {
    return reply.fault == Fault::kNone ? reply.body.value(name, std::string()) : std::string();
  }
  std::string stage() const { return field("stage"); }
};

using Keys = std::vector<std::pair<std::string, int64_t>>;  // key, tensor number

Keys keys_of(const json& entries) {
  Keys out;
  for (const auto& e : entries)
    out.emplace_back(e.at(0).get<std::string>(), e.at(1).get<int64_t>());
  return out;
}

/// The names of a reply's keys (its state dict, in order).
std::vector<std::string> key_names(const json& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.at(0).get<std::string>());
  return out;
}

Verdict pass(const std::string& property) {
  Verdict v;
  v.property = property;
  return v;
}

Verdict fail(const std::string& property, std::string reason, std::string key = {}) {
  Verdict v;
  v.property = property;
  v.passed = false;
  v.reason = std::move(reason);
  v.key = std::move(key);
  return v;
}

/// P1's comparison: same keys, same order, same count (never a zip).
Verdict same_keys(const std::string& property, const Keys& got, const Keys& want,
                  const std::string& what, const std::string& other = "the model") {
  auto names = [](const Keys& keys) {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& item : keys) out.push_back(item.first);
    return out;
  };
  const auto d = props::first_key_difference(names(got), names(want));
  if (!d) return pass(property);
  if (!d->got.empty() && !d->want.empty()) {
    return fail(property,
                what + " has key " + std::to_string(d->index) + " '" + d->got + "' where " + other +
                    " has '" + d->want + "'",
                d->key());
  }
  if (d->got_size > d->want_size) {
    return fail(
        property,
        what + " has " + std::to_string(d->got_size - d->want_size) + " key(s) more than " + other,
        d->key());
  }
  return fail(property, what + " lacks the key '" + d->want + "' of " + other, d->key());
}

std::set<std::vector<std::string>> tie_groups(const Keys& keys) {
  std::map<int64_t, std::vector<std::string>> by;
  for (const auto& [k, t] : keys) by[t].push_back(k);
  std::set<std::vector<std::string>> out;
  for (auto& [t, ks] : by) {
    if (ks.size() > 1) out.insert(ks);
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

Verdict skip(const std::string& property, std::string reason) {
  Verdict v = pass(property);
  v.skipped = true;
  v.reason = std::move(reason);
  return v;
}

/// Python wrappers that a wrapcert kind models, by the names certify-python accepts, and those
/// the options add.
std::map<std::string, std::string> cxx_kinds(const Options& options) {
  std::map<std::string, std::string> kinds = {
      {"DataParallel", "DataParallel"},
      {"torch.nn:DataParallel", "DataParallel"},
      {"torch.nn.parallel:DataParallel", "DataParallel"},
      {"DistributedDataParallel", "DistributedDataParallel"},
      {"checkpoint_wrapper", "CheckpointWrapper"},
      {"checkpoint_wrapper[reentrant]", "CheckpointWrapper"}};
  for (const auto& [wrapper, kind] : options.models) kinds[wrapper] = kind;
  return kinds;
}

/// What the subject or the wrapped model raised, as a failed verdict for `property`.
std::optional<Verdict> common_failure(const std::string& property, const Observed& o,
                                      const std::string& subject) {
  if (o.reply.fault != Fault::kNone) return fail(property, o.reply.message);
  if (!o.disagreement.empty()) return fail(property, o.disagreement);
  if (o.ok()) return std::nullopt;
  const auto stage = o.stage();
  const auto error = o.field("error");
  if (stage == "unwrap")
    return fail(property, "the unwrap subject " + subject + " raised " + error);
  if (stage == "contract") {
    return fail(property, "the wrapper " + o.field("who") + ": " + error);
  }
  return fail(property, "the worker could not run the case (" + stage + "): " + error);
}

using Check = std::function<Verdict(const gen::TreeSpec&, const Observed&)>;

struct PythonProperty {
  std::string name;
  bool numerics = false;  ///< the case must run forward and backward
  std::function<void(gen::GenOptions&)> adjust;
  Check check;
  std::string skip = {};   ///< non-empty: nothing to compare in this run (why); no case is run
  bool trains = false;     ///< the case is the training loop (P17)
  bool per_dtype = false;  ///< a row per dtype, its cases in training or eval mode
};

/// A run's values as the worker sends them: float64, little-endian, eight bytes apiece, as one
/// hex string (exact in every dtype, NaN and infinities included).
std::vector<double> values_of(const json& v) {
  const auto& text = v.get_ref<const std::string&>();
  if (text.size() % 16 != 0) {
    throw std::runtime_error("the worker sent " + std::to_string(text.size()) +
                             " hex digits of values, not a multiple of 16");
  }
  std::vector<double> out(text.size() / 16);
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t bits = 0;
    for (size_t byte = 0; byte < 8; ++byte) {
      const char* at = text.data() + 16 * i + 2 * byte;
      unsigned value = 0;
      if (std::from_chars(at, at + 2, value, 16).ptr != at + 2) {
        throw std::runtime_error("the worker sent values that are not hex digits at value " +
                                 std::to_string(i));
      }
      bits |= static_cast<uint64_t>(value) << (8 * byte);
    }
    std::memcpy(&out[i], &bits, sizeof bits);
  }
  return out;
}

std::string hex_float(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%a", v);
  return text;
}

/// Compares two runs' values; empty when they agree within `tolerance`.
std::string differs(const json& a_sent, const json& b_sent, double tolerance,
                    double relative = 0.0) {
  const auto a = values_of(a_sent), b = values_of(b_sent);
  if (a.size() != b.size()) {
    return std::to_string(a.size()) + " values against " + std::to_string(b.size());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    const bool same = tolerance == 0.0 && relative == 0.0
                          ? (x == y || (std::isnan(x) && std::isnan(y)))
                          : std::fabs(x - y) <= tolerance + relative * (std::fabs(y) + 1.0);
    if (!same) {
      return "value " + std::to_string(i) + " is " + hex_float(x) + " against " + hex_float(y);
    }
  }
  return {};
}

/// The first key (of the model) naming tensor number `t`.
std::string key_of(const Keys& keys, const std::string& t) {
  if (t == "input") return "the input";
  for (const auto& [k, id] : keys) {
    if (std::to_string(id) == t) return k;
  }
  return "tensor " + t;
}

/// P8's translator, driven by the wrapped model's tree as the worker saw it: a wrapped key's
/// components are followed from the root, and where the path crosses a wrapper its slot is
/// dropped, whether the key spells it or the wrapper left it out of its state dict (torch's
/// CheckpointWrapper strips its own prefix in a state-dict hook). Where both readings name a
/// tensor, the one that spells the slot wins.
class Translation {
 public:
  explicit Translation(const json& d) {
    std::map<std::string, std::string> slot_of;
    for (const auto& w : d.at("wrappers")) slot_of[w[1].get<std::string>()] = w[2];
    for (const auto& m : d.at("wrapped_modules")) {
      const auto path = m[0].get<std::string>();
      auto& node = nodes_[path];
      if (const auto it = slot_of.find(m[1].get<std::string>()); it != slot_of.end()) {
        node.slot = it->second;
      }
      for (const auto& name : m[3]) node.tensors.insert(name.get<std::string>());
    }
  }

  std::optional<std::string> to_clean(const std::string& key) const {
    std::vector<std::string> parts;
    for (const auto part : detail::split_path(key)) parts.emplace_back(part);
    std::vector<std::string> kept;
    if (!walk("", parts, 0, kept)) return std::nullopt;
    std::string out;
    for (const auto& k : kept) out += (out.empty() ? "" : ".") + k;
    return out;
  }

 private:
  struct Node {
    std::string slot;  // non-empty for a wrapper
    std::set<std::string> tensors;
  };
  static std::string join(const std::string& path, const std::string& name) {
    return path.empty() ? name : path + "." + name;
  }
  bool walk(const std::string& path, const std::vector<std::string>& parts, size_t i,
            std::vector<std::string>& kept) const {
    const auto it = nodes_.find(path);
    if (it == nodes_.end()) return false;
    const auto& node = it->second;
    if (!node.slot.empty()) {
      if (i + 1 == parts.size() && node.tensors.count(parts[i])) {  // the wrapper's own state
        kept.push_back(parts[i]);
        return true;
      }
      const auto inner = join(path, node.slot);
      if (parts[i] == node.slot && i + 1 < parts.size() && walk(inner, parts, i + 1, kept)) {
        return true;
      }
      return walk(inner, parts, i, kept);  // the slot left out of the key
    }
    if (i + 1 == parts.size()) {
      if (!node.tensors.count(parts[i])) return false;
      kept.push_back(parts[i]);
      return true;
    }
    kept.push_back(parts[i]);
    if (walk(join(path, parts[i]), parts, i + 1, kept)) return true;
    kept.pop_back();
    return false;
  }

  std::map<std::string, Node> nodes_;
};

/// The machine epsilon of a dtype as the worker names it.
double epsilon_of(const std::string& dtype) {
  if (dtype == "float32") return 0x1p-23;
  if (dtype == "bfloat16") return 0x1p-7;
  if (dtype == "float16") return 0x1p-10;
  return 0x1p-52;
}

/// P4 on one rank's case `d`: the wrapped and the unwrapped runs against the model's. Across
/// ranks (`d` has every rank's slice run on the model), a parameter held by a wrapper that
/// reduces gets the mean (or sum) over the ranks of the slices' gradients, within 2(N+1)
/// epsilons of its dtype, as the C++ properties across ranks allow; everything else (outputs,
/// the input's gradient, parameters no reducing wrapper holds) is this rank's own.
Verdict backward_part(const std::string& p, const json& d, bool single, double tolerance,
                      const std::map<std::string, std::string>& reductions,
                      const std::string& rank) {
  auto part = [single](const json& run) -> const json& { return single ? run.at("single") : run; };
  const std::string batch = single ? " (a single example)" : " (a batch)";
  const auto original = keys_of(d.at("original"));
  const auto& m = part(d.at("run_original"));
  const auto& wrappers = d.at("wrappers");
  // Across ranks: for each parameter a reducing wrapper holds, the reduced slices' gradients.
  std::map<std::string, std::vector<double>> reduced;
  std::map<std::string, std::string> reduced_how;
  if (d.contains("run_slices")) {
    const auto& slices = d.at("run_slices");
    std::map<std::string, std::pair<int, int>> held;  // tensor -> (means, sums) holding it
    for (const auto& w : wrappers) {
      if (w.size() < 6) continue;
      const auto declared = reductions.find(w[0].get<std::string>());
      const std::string how = declared != reductions.end() ? declared->second
                              : w[5].is_string()           ? w[5].get<std::string>()
                                                           : std::string();
      if (how.empty()) continue;
      for (const auto& t : w[4]) {
        auto& h = held[std::to_string(t.get<int64_t>())];
        (how == "sum" ? h.second : h.first) += 1;
      }
    }
    for (const auto& [t, h] : held) {
      std::vector<double> sum;
      bool any = false;
      for (const auto& slice : slices) {
        if (!part(slice).at("grads").contains(t)) continue;
        const auto g = values_of(part(slice).at("grads")[t]);
        sum.resize(g.size(), 0.0);
        for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
        any = true;
      }
      if (!any) continue;
      // Nested reducing wrappers do not compound: each reduces the rank's own gradient and the
      // last to finish writes it. Wrappers that disagree leave either result.
      reduced[t] = std::move(sum);
      reduced_how[t] = h.second == 0 ? "mean" : h.first == 0 ? "sum" : "mean or the sum";
    }
  }
  const double world = d.contains("run_slices") ? static_cast<double>(d["run_slices"].size()) : 1;
  for (const char* which : {"run_wrapped", "run_unwrapped"}) {
    const bool wrapped = std::string(which) == "run_wrapped";
    const std::string name = wrapped ? "wrapped" : "unwrapped";
    const auto& r = part(d.at(which));
    if (r.value("shape", json()) != m.value("shape", json())) {
      return fail(p, rank + "the " + name + " model's output has shape " +
                         r.value("shape", json()).dump() + " where the model's has " +
                         m.value("shape", json()).dump() + batch);
    }
    if (auto why = differs(r.at("output"), m.at("output"), tolerance); !why.empty()) {
      return fail(p, rank + "the " + name + " model's output differs from the model's" + batch +
                         ": " + why);
    }
    for (const auto& [t, g] : m.at("grads").items()) {
      if (!r.at("grads").contains(t) && !(wrapped && reduced.count(t))) {
        return fail(p, rank + "no gradient in the " + name + " run" + batch, key_of(original, t));
      }
      if (wrapped && reduced.count(t)) continue;
      if (auto why = differs(r.at("grads")[t], g, tolerance); !why.empty()) {
        return fail(p, rank + "the gradient in the " + name + " run differs" + batch + ": " + why,
                    key_of(original, t));
      }
    }
    if (wrapped) {
      for (const auto& [t, want] : reduced) {
        if (!r.at("grads").contains(t)) {
          return fail(p, rank + "no gradient in the wrapped run" + batch, key_of(original, t));
        }
        const auto got = values_of(r.at("grads")[t]);
        const auto& table = d.at("tensors");
        const auto index = std::stoul(t);
        const double eps =
            epsilon_of(index < table.size() ? table[index].value("dtype", "") : std::string());
        const double bound = 2.0 * (world + 1) * eps;
        const auto& how = reduced_how[t];
        double largest = 0;
        bool within = false;
        for (const double scale : {1.0 / world, 1.0}) {
          if ((scale == 1.0 ? how == "mean" : how == "sum") || got.size() != want.size()) continue;
          bool all = true;
          double at = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double diff = std::fabs(got[i] - scale * want[i]);
            at = std::max(at, diff);
            all = all && diff <= bound * (std::fabs(scale * want[i]) + 1.0) + tolerance;
          }
          within = within || all;
          largest = largest == 0 ? at : std::min(largest, at);
        }
        if (!within) {
          std::ostringstream text;
          text << rank << "the gradient in the wrapped run is not the " << how << " over the "
               << world << " ranks of the gradients their slices give the model";
          if (got.size() == want.size()) text << " (largest difference " << largest << ")";
          return fail(p, text.str(), key_of(original, t));
        }
      }
    }
    for (const auto& [t, g] : r.at("grads").items()) {
      if (!m.at("grads").contains(t) && !(wrapped && reduced.count(t))) {
        return fail(p, rank + "a gradient in the " + name + " run the model has none for" + batch,
                    key_of(original, t));
      }
    }
  }
  return pass(p);
}

Verdict backward(const std::string& p, const json& d, double tolerance,
                 const std::map<std::string, std::string>& reductions, const std::string& rank) {
  if (d.contains("run_wrapped_error")) {
    return fail(
        p, rank + "the wrapped model does not run: " + d["run_wrapped_error"].get<std::string>());
  }
  if (d.contains("run_unwrapped_error")) {
    return fail(p, rank + "the unwrapped model does not run: " +
                       d["run_unwrapped_error"].get<std::string>());
  }
  for (const bool single : {false, true}) {
    auto v = backward_part(p, d, single, tolerance, reductions, rank);
    if (!v.passed) return v;
  }
  const auto& wrappers = d.at("wrappers");
  for (size_t i = 0; i < wrappers.size(); ++i) {
    const auto where = wrappers[i][3].get<std::string>();
    if (d.at("wrapped_calls")[i].get<int>() == 0) {
      return fail(p,
                  rank + "the wrapped run did not go through the " +
                      wrappers[i][1].get<std::string>() + " wrapping the module",
                  where);
    }
    if (d.at("unwrapped_calls")[i].get<int>() != 0) {
      return fail(p,
                  rank + "the unwrapped run went through the " + wrappers[i][1].get<std::string>() +
                      " wrapping the module",
                  where);
    }
  }
  return pass(p);
}

/// Whether every value a run sent is finite (a diverged run has nothing to compare).
bool all_finite(const json& sent) {
  for (const double v : values_of(sent)) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// What step `i` of the training loop was, as reports say it (the C++ loop's words).
std::string step_text(const json& step, size_t i, size_t n, const std::string& optimizer) {
  const auto what = step.at("what").get<std::string>();
  const bool training = step.value("training", true);
  return "step " + std::to_string(i + 1) + " of " + std::to_string(n) + ", " +
         (what == "train"     ? "forward, backward and " + optimizer + " step"
          : what == "no_grad" ? std::string("a call under torch.no_grad()")
                              : std::string(training ? "train()" : "eval()") +
                                    " through the wrappers, then a call") +
         " in " + (training ? "training" : "eval") + " mode on a batch of " +
         std::to_string(step.at("batch").get<int64_t>());
}

/// P17 on one case the worker trained: after each step, the wrapped copy's outputs, gradients,
/// modes, requires_grad flags and values against the model's (bit for bit, or within
/// `tolerance` per optimizer step so far); then the trained copy unwrapped, saved and loaded
/// into a fresh model must compute what the trained model computes.
Verdict training(const std::string& p, const gen::TreeSpec& spec, const json& d, double tolerance) {
  const auto keys = key_names(d.at("original"));
  const auto& steps = d.at("steps");
  const std::string optimizer =
      spec.optimizer == gen::Optimizer::kAdam ? "Adam" : "SGD(momentum=0.9)";
  int optimizer_steps = 0;
  const size_t count = d.value("step_count", steps.size());
  // Across ranks, the gradients a reducing wrapper holds are reduced by it and, for the model,
  // by torch.distributed tensor by tensor: at world size 2 a sum of two, the same either way;
  // above, the two may add in other orders (and divide by 3 otherwise), so those runs are held
  // to P4's bound across ranks, 2(N+1) epsilons, widened by four times that per optimizer step.
  const int world = d.value("world_size", 1);
  const bool orders = world > 2 && !d.value("reduced", json::array()).empty();
  auto relative = [&] {
    return orders ? 2.0 * (world + 1) * gen::epsilon(spec.dtype) * (1 + 4 * optimizer_steps) : 0.0;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    const auto at = step_text(s, i, count, optimizer);
    if (s.contains("error")) {
      return fail(p, at + ": " + s.value("who", std::string("the wrapped model")) + " raised " +
                         s["error"].get<std::string>());
    }
    const double bound = tolerance * (optimizer_steps + 1);
    if (!all_finite(s.at("want_output"))) {
      return skip(p, "the model's training diverged (" + at + ")");
    }
    if (const auto why = differs(s.at("output"), s.at("want_output"), bound, relative());
        !why.empty()) {
      return fail(p, at + ": the output through the wrappers differs: " + why);
    }
    if (s.at("what") == "train") {
      const auto& got = s.at("grads");
      const auto& want = s.at("want_grads");
      for (size_t k = 0; k < keys.size() && k < want.size(); ++k) {
        if (want[k].is_null() && got[k].is_null()) continue;
        if (want[k].is_null()) {
          return fail(p, at + ": a gradient through the wrappers where the model has none",
                      keys[k]);
        }
        if (got[k].is_null()) {
          return fail(p, at + ": no gradient through the wrappers reaches this parameter", keys[k]);
        }
        if (const auto why = differs(got[k], want[k], bound, relative()); !why.empty()) {
          return fail(p, at + ": a gradient through the wrappers differs: " + why, keys[k]);
        }
      }
      ++optimizer_steps;
    }
    const bool training = s.value("training", true);
    for (const auto& m : s.at("modes")) {
      if (m[1].get<bool>() != training) {
        const auto path = m[0].get<std::string>();
        return fail(p,
                    at + ": a module of the wrapped model is in " +
                        (training ? "eval" : "training") + " mode, the model in " +
                        (training ? "training" : "eval") + " mode",
                    path.empty() ? std::string("<root>") : path);
      }
    }
    const auto& flags = s.at("requires_grad");
    const auto& want_flags = s.at("want_requires_grad");
    for (size_t k = 0; k < keys.size() && k < flags.size() && k < want_flags.size(); ++k) {
      if (flags[k] != want_flags[k]) {
        return fail(p,
                    at + ": requires_grad is " + (flags[k].get<bool>() ? "True" : "False") +
                        ", the model's " + (want_flags[k].get<bool>() ? "True" : "False"),
                    keys[k]);
      }
    }
    const auto& shapes = s.at("shapes");
    const auto& want_shapes = s.at("want_shapes");
    const auto& values = s.at("values");
    const auto& want_values = s.at("want_values");
    for (size_t k = 0; k < keys.size() && k < values.size() && k < want_values.size(); ++k) {
      if (shapes[k] != want_shapes[k]) {
        return fail(p,
                    at + ": the tensor's shape or dtype changed (" + shapes[k].dump() +
                        " against " + want_shapes[k].dump() + ")",
                    keys[k]);
      }
      const double value_bound = tolerance * optimizer_steps;
      if (const auto why = differs(values[k], want_values[k], value_bound, relative());
          !why.empty()) {
        return fail(p, at + ": the model's values differ from training without wrappers: " + why,
                    keys[k]);
      }
    }
  }
  const std::string at = "after the " + std::to_string(steps.size()) + " steps";
  const auto& c = d.at("checkpoint");
  if (c.contains("error")) {
    return fail(p, at + ": the checkpoint of the trained model, unwrapped: " +
                       c["error"].get<std::string>());
  }
  if (!all_finite(c.at("want_output"))) {
    return skip(p, "the model's training diverged (" + at + ")");
  }
  if (const auto why = differs(c.at("output"), c.at("want_output"),
                               tolerance * (optimizer_steps + 1), relative());
      !why.empty()) {
    return fail(p, at +
                       ": the trained model, unwrapped, saved with torch.save and loaded into a "
                       "fresh model, computes otherwise than the trained model: " +
                       why);
  }
  return pass(p);
}

/// The wrapped model's keys that are its wrappers' own persistent state, declared with
/// `--owned-state`.
std::set<std::string> declared_keys(const json& d,
                                    const std::map<std::string, std::vector<std::string>>& owned) {
  std::set<std::string> out;
  for (const auto& w : d.at("wrappers")) {
    if (w.size() < 8) continue;
    const auto it = owned.find(w[0].get<std::string>());
    if (it == owned.end()) continue;
    const auto at = w[7].is_string() ? w[7].get<std::string>() : w[3].get<std::string>();
    for (const auto& item : w[6]) {
      const auto own = item[0].get<std::string>();
      if (item[3].get<bool>() && std::count(it->second.begin(), it->second.end(), own)) {
        out.insert(at.empty() ? own : at + "." + own);
      }
    }
  }
  return out;
}

std::vector<PythonProperty> python_properties(const Options& options) {
  const std::string subject = options.unwrap.empty() ? "(the reference port)" : options.unwrap;
  const auto owned = options.owned_state;
  std::vector<PythonProperty> out;
  auto plain = [](gen::GenOptions&) {};

  out.push_back({"layout", false, plain, [](const gen::TreeSpec& spec, const Observed& o) {
                   if (!o.ok() && o.stage() != "unwrap" && o.stage() != "contract") {
                     return *common_failure("layout", o, "");
                   }
                   if (!o.ok()) return pass("layout");
                   // The same spec built by the C++ builder has the same keys.
                   Keys want;
                   for (const auto& item : gen::build(spec, {c10::kDouble, 0, false}).original) {
                     want.emplace_back(item.key(), 0);
                   }
                   return same_keys("layout", keys_of(o.data().at("original")), want,
                                    "the model built in Python");
                 }});
  const bool port = options.unwrap.empty();
  out.push_back({"C++ agreement", false, plain,
                 [port, kinds = cxx_kinds(options)](const gen::TreeSpec& spec, const Observed& o) {
                   // The same spec in LibTorch, each Python wrapper replaced by the wrapcert kind
                   // that models it: the kind's saved keys are the real wrapper's, and the C++
                   // reference unwrap gives the keys the Python port gives.
                   const std::string p = "C++ agreement";
                   if (!o.ok()) return *common_failure(p, o, "");
                   auto mapped = spec;
                   bool all = true;
                   std::function<void(gen::NodeSpec&)> map = [&](gen::NodeSpec& n) {
                     for (auto& w : n.wrappers) {
                       const auto it = kinds.find(w);
                       if (it == kinds.end()) {
                         all = false;
                         return;
                       }
                       w = it->second;
                     }
                     for (auto& c : n.children) map(c.second);
                   };
                   map(mapped.root);
                   if (!all) return skip(p, "a wrapper with no wrapcert kind that models it");
                   const auto built = gen::build(mapped, {c10::kDouble, 0, true});
                   const auto& registry = Registry::global();
                   const auto saved =
                       ModuleView::build(built.root, [&registry](const torch::nn::Module& m) {
                         const auto* kind = registry.find(m);
                         return kind && kind->state_dict_hides_slot ? kind : nullptr;
                       }).state_dict();
                   Keys cxx;
                   for (const auto& item : saved) cxx.emplace_back(item.key(), 0);
                   auto v =
                       same_keys(p, keys_of(o.data().at("wrapped")), cxx,
                                 "the real wrappers' state dict", "the wrapcert kinds' state dict");
                   if (!v.passed || !port) return v;
                   Keys reference;
                   for (const auto& item : unwrap_reference(built.root).state_dict()) {
                     reference.emplace_back(item.key(), 0);
                   }
                   return same_keys(p, keys_of(o.data().at("unwrapped")), reference,
                                    "the Python port's unwrap", "the C++ reference unwrap");
                 }});
  {
    const auto kinds = cxx_kinds(options);
    std::string unmodelled;
    for (const auto& w : options.wrappers) {
      if (!kinds.count(w)) unmodelled += (unmodelled.empty() ? "" : ", ") + w;
    }
    if (!unmodelled.empty()) {
      out.back().skip =
          "no wrapcert kind models " + unmodelled + " (name one with --models " + "WRAPPER=KIND)";
    }
  }
  out.push_back({"P1 keys", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
                   if (auto f = common_failure("P1 keys", o, subject)) return *f;
                   const auto& d = o.data();
                   auto v = same_keys("P1 keys", keys_of(d.at("unwrapped")),
                                      keys_of(d.at("original")), "the unwrapped model");
                   if (v.passed && !d.at("unwrapped_wrappers").empty()) {
                     const auto path = d.at("unwrapped_wrappers")[0].get<std::string>();
                     return fail("P1 keys", "a wrapper is still on the path '" + path + "'", path);
                   }
                   return v;
                 }});
  out.push_back(
      {"P2 identity", false, plain, [subject](const gen::TreeSpec& spec, const Observed& o) {
         const std::string p = "P2 identity";
         if (auto f = common_failure(p, o, subject)) return *f;
         const auto& d = o.data();
         const auto& original = d.at("original");
         std::map<std::string, const json*> got;
         for (const auto& e : d.at("unwrapped")) got[e.at(0).get<std::string>()] = &e;
         for (const auto& e : original) {
           const auto k = e.at(0).get<std::string>();
           const auto it = got.find(k);
           if (it == got.end()) return fail(p, "the model's tensor is missing after unwrap", k);
           if (it->second->at(1) != e.at(1)) {
             return fail(p, "not the model's own tensor after unwrap", k);
           }
           if (e.size() > 2 && it->second->size() > 2 && it->second->at(2) != e.at(2)) {
             return fail(p,
                         std::string("requires_grad is ") +
                             (it->second->at(2).get<bool>() ? "True" : "False") +
                             " after wrapping and unwrapping, the model's " +
                             (e.at(2).get<bool>() ? "True" : "False"),
                         k);
           }
         }
         // Every module of the unwrapped model in the mode the wrapped model was put in
         // (`eval()` through the wrappers for a case drawn in eval mode).
         const bool training = !spec.eval;
         for (const auto& m : d.at("unwrapped_modules")) {
           if (m.size() > 4 && m[4].get<bool>() != training) {
             const auto path = m[0].get<std::string>();
             return fail(p,
                         std::string("a ") + m[1].get<std::string>() + " is in " +
                             (training ? "eval" : "training") + " mode, the model in " +
                             (training ? "training" : "eval") + " mode",
                         path.empty() ? std::string("<root>") : path);
           }
         }
         return pass(p);
       }});
  out.push_back({"P3 ties", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
                   if (auto f = common_failure("P3 ties", o, subject)) return *f;
                   const auto want = tie_groups(keys_of(o.data().at("original")));
                   const auto got = tie_groups(keys_of(o.data().at("unwrapped")));
                   for (const auto& g : want) {
                     if (!got.count(g)) {
                       return fail("P3 ties",
                                   "the keys " + joined(g) +
                                       " share one tensor in the model, not after unwrap",
                                   g.front());
                     }
                   }
                   for (const auto& g : got) {
                     if (!want.count(g)) {
                       return fail("P3 ties",
                                   "the keys " + joined(g) +
                                       " share one tensor after unwrap, not in the model",
                                   g.front());
                     }
                   }
                   return pass("P3 ties");
                 }});
  const double tolerance = options.tolerance;
  // Declared reductions; an undeclared wrapper reduces as its class promises (the worker says).
  const auto reductions = options.reductions;
  out.push_back(
      {"P4 backward", true, plain,
       [subject, tolerance, reductions](const gen::TreeSpec&, const Observed& o) -> Verdict {
         const std::string p = "P4 backward";
         if (auto f = common_failure(p, o, subject)) return *f;
         if (o.ranks.empty()) return backward(p, o.data(), tolerance, reductions, "");
         for (size_t r = 0; r < o.ranks.size(); ++r) {
           auto v =
               backward(p, o.ranks[r], tolerance, reductions, "rank " + std::to_string(r) + ": ");
           if (!v.passed) return v;
         }
         return pass(p);
       }});
  out.push_back(
      {"P5 non-mutation", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P5 non-mutation";
         if (auto f = common_failure(p, o, subject)) return *f;
         const auto& d = o.data();
         const auto before = keys_of(d.at("wrapped")), after = keys_of(d.at("wrapped_after"));
         auto v = same_keys(p, after, before, "the wrapped model after unwrap",
                            "the wrapped model before");
         if (!v.passed) return v;
         for (size_t i = 0; i < before.size(); ++i) {
           if (before[i].second != after[i].second) {
             return fail(p, "the wrapped model holds another tensor after unwrap", before[i].first);
           }
         }
         const auto& mb = d.at("wrapped_modules");
         const auto& ma = d.at("wrapped_modules_after");
         for (size_t i = 0; i < std::min(mb.size(), ma.size()); ++i) {
           if (mb[i] != ma[i]) {
             const auto path = mb[i][0].get<std::string>();
             return fail(p,
                         "the wrapped model changed at '" + path + "': it held a " +
                             mb[i][1].get<std::string>() + ", now '" + ma[i][0].get<std::string>() +
                             "' is a " + ma[i][1].get<std::string>(),
                         path);
           }
         }
         if (mb.size() != ma.size()) {
           return fail(p, "the wrapped model has " + std::to_string(ma.size()) +
                              " module paths after unwrap, " + std::to_string(mb.size()) +
                              " before");
         }
         return pass(p);
       }});
  out.push_back({"P6 laws", false, plain, [subject](const gen::TreeSpec& spec, const Observed& o) {
                   const std::string p = "P6 laws";
                   if (auto f = common_failure(p, o, subject)) return *f;
                   const auto& d = o.data();
                   if (d.contains("again_error")) {
                     return fail(p, "unwrapping the unwrapped model raised " +
                                        d["again_error"].get<std::string>());
                   }
                   const auto once = keys_of(d.at("unwrapped")), twice = keys_of(d.at("again"));
                   auto v = same_keys(p, twice, once, "u(u(x))");
                   if (!v.passed) return v;
                   if (once != twice) return fail(p, "u(u(x)) holds other tensors than u(x)");
                   if (!has_wrappers(spec.root) && !d.at("unwrapped_is_model").get<bool>()) {
                     return fail(p, "u(M) is not M for a model without wrappers");
                   }
                   return pass(p);
                 }});
  out.push_back(
      {"P8 translation", false, plain, [subject, owned](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P8 translation";
         if (auto f = common_failure(p, o, subject)) return *f;
         const auto& d = o.data();
         const Translation translation(d);
         std::map<std::string, int64_t> model;
         for (const auto& [k, t] : keys_of(d.at("original"))) model.emplace(k, t);
         std::set<std::string> seen;
         // A wrapper's own state, declared (--owned-state), is its own: P15 judges it.
         const auto declared = declared_keys(d, owned);
         Keys wrapped;
         for (const auto& item : keys_of(d.at("wrapped"))) {
           if (!declared.count(item.first)) wrapped.push_back(item);
         }
         for (const auto& [key, t] : wrapped) {
           const auto clean = translation.to_clean(key);
           if (!clean) {
             return fail(p, "names no tensor of the wrapped model's tree", key);
           }
           if (!seen.insert(*clean).second) {
             return fail(p, "two wrapped keys translate to '" + *clean + "'", key);
           }
           const auto it = model.find(*clean);
           if (it == model.end()) {
             return fail(p, "translates to '" + *clean + "', which the model does not have", key);
           }
           if (it->second != t) {
             return fail(
                 p, "translates to '" + *clean + "', which holds another tensor in the model", key);
           }
         }
         if (wrapped.size() != model.size()) {
           return fail(p, "the wrapped model has " + std::to_string(wrapped.size()) +
                              " keys, the model " + std::to_string(model.size()));
         }
         return pass(p);
       }});
  out.push_back({"P9 no false positives", false,
                 [](gen::GenOptions& g) {
                   g.wrappers = false;
                   g.adversarial_names = true;
                 },
                 [subject](const gen::TreeSpec&, const Observed& o) {
                   const std::string p = "P9 no false positives";
                   if (auto f = common_failure(p, o, subject)) return *f;
                   const auto& d = o.data();
                   auto v = same_keys(p, keys_of(d.at("unwrapped")), keys_of(d.at("original")),
                                      "the unwrapped model (which had no wrappers)");
                   if (!v.passed) return v;
                   if (!d.at("unwrapped_is_model").get<bool>()) {
                     return fail(p, "a model without wrappers did not come back as itself");
                   }
                   return pass(p);
                 }});
  out.push_back(
      {"P10 round trip", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P10 round trip";
         if (auto f = common_failure(p, o, subject)) return *f;
         const auto& r = o.data().at("round_trip");
         if (r.contains("error")) {
           return fail(p,
                       "the unwrapped model's state dict, saved with torch.save: " +
                           r["error"].get<std::string>(),
                       r.value("key", std::string()));
         }
         return pass(p);
       }});
  out.push_back(
      {"P11 graph safety", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P11 graph safety";
         if (auto f = common_failure(p, o, subject)) return *f;
         auto groups = [](const json& modules) {
           std::map<int64_t, std::vector<std::string>> by;
           for (const auto& m : modules) by[m[2].get<int64_t>()].push_back(m[0]);
           std::set<std::vector<std::string>> out;
           for (auto& [id, paths] : by) {
             if (paths.size() > 1) out.insert(paths);
           }
           return out;
         };
         const auto want = groups(o.data().at("original_modules"));
         const auto got = groups(o.data().at("unwrapped_modules"));
         for (const auto& g : want) {
           if (!got.count(g)) {
             return fail(
                 p, "the paths " + joined(g) + " reach one module in the model, not after unwrap",
                 g.front());
           }
         }
         return pass(p);
       }});
  out.push_back({"P13 values", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
                   const std::string p = "P13 values";
                   if (auto f = common_failure(p, o, subject)) return *f;
                   const auto& tensors = o.data().at("tensors");
                   std::map<std::string, json> model;
                   for (const auto& [k, t] : keys_of(o.data().at("original")))
                     model[k] = tensors.at(t);
                   for (const auto& [k, t] : keys_of(o.data().at("unwrapped"))) {
                     const auto it = model.find(k);
                     if (it == model.end()) continue;  // P1's finding
                     const auto& got = tensors.at(t);
                     if (got.at("shape") != it->second.at("shape") ||
                         got.at("dtype") != it->second.at("dtype")) {
                       return fail(p, "shape or dtype differs from the model's", k);
                     }
                     if (got.at("digest") != it->second.at("digest")) {
                       return fail(p, "the values differ from the model's", k);
                     }
                   }
                   return pass(p);
                 }});
  out.push_back(
      {"P14 release", true, plain,
       [release = options.release](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P14 release";
         if (auto f = common_failure(p, o, release)) return *f;
         const auto& d = o.data();
         if (d.contains("release_error")) {
           return fail(
               p, "the release " + release + " raised " + d["release_error"].get<std::string>());
         }
         const auto model = keys_of(d.at("original"));
         const auto released = keys_of(d.at("released"));
         auto v = same_keys(p, released, model, "the released model");
         if (!v.passed) return v;
         for (size_t i = 0; i < model.size(); ++i) {
           if (released[i].second != model[i].second) {
             return fail(p, "not the model's own tensor after release", model[i].first);
           }
         }
         if (!d.at("released_wrappers").empty()) {
           const auto path = d.at("released_wrappers")[0].get<std::string>();
           return fail(p, "a wrapper is still on the path after release", path);
         }
         if (!d.contains("run_released")) return pass(p);
         for (const bool single : {false, true}) {
           const auto& m = single ? d.at("run_original").at("single") : d.at("run_original");
           const auto& r = single ? d.at("run_released").at("single") : d.at("run_released");
           const std::string batch = single ? " (a single example)" : " (a batch)";
           if (r.value("shape", json()) != m.value("shape", json()) ||
               !differs(r.at("output"), m.at("output"), 0).empty()) {
             return fail(p, "the released model's output differs from the model's" + batch);
           }
           for (const auto& [t, g] : m.at("grads").items()) {
             if (!r.at("grads").contains(t) || !differs(r.at("grads")[t], g, 0).empty()) {
               return fail(p, "the released model's gradient differs from the model's" + batch,
                           key_of(model, t));
             }
           }
         }
         return pass(p);
       }});
  if (options.release.empty()) out.back().skip = "no release function given (--release)";
  out.push_back(
      {"P15 owned state", false, plain, [subject, owned](const gen::TreeSpec&, const Observed& o) {
         const std::string p = "P15 owned state";
         if (auto f = common_failure(p, o, subject)) return *f;
         const auto& d = o.data();
         std::map<std::string, std::set<std::string>> local;  // wrapped path -> own tensor names
         for (const auto& m : d.at("wrapped_modules")) {
           for (const auto& n : m[3]) local[m[0].get<std::string>()].insert(n.get<std::string>());
         }
         for (const auto& w : d.at("wrappers")) {
           if (w.size() < 8) continue;
           const auto name = w[0].get<std::string>(), cls = w[1].get<std::string>();
           const auto slot = w[2].get<std::string>();
           const auto at = w[7].is_string() ? w[7].get<std::string>() : w[3].get<std::string>();
           const auto it = owned.find(name);
           const auto slot_path = at.empty() ? slot : at + "." + slot;
           for (const auto& item : w[6]) {
             const auto own = item[0].get<std::string>(), what = item[1].get<std::string>();
             const auto key = at.empty() ? own : at + "." + own;
             if (item[2].get<bool>()) {
               return fail(p,
                           "the " + cls + " registers one of the model's own " + what +
                               "s a second time, as '" + own +
                               "' (every tensor under it is "
                               "saved twice)",
                           key);
             }
             const bool declared =
                 it != owned.end() && std::count(it->second.begin(), it->second.end(), own);
             if (!declared) {
               return fail(p,
                           "the " + cls + " holds " +
                               (item[3].get<bool>() ? "a " : "a non-persistent ") + what + " '" +
                               own + "' of its own that it does not declare (--owned-state " +
                               name + "=" + own + ")",
                           key);
             }
             if (item[3].get<bool>() && local[slot_path].count(own)) {  // both saved under one key
               return fail(p,
                           "the " + cls + "'s own '" + own + "' and its slot's '" + slot + "." +
                               own + "' translate to one key",
                           key);
             }
           }
         }
         return pass(p);
       }});
  out.push_back({"P16 aliases", false, plain, [subject](const gen::TreeSpec&, const Observed& o) {
                   const std::string p = "P16 aliases";
                   if (auto f = common_failure(p, o, subject)) return *f;
                   for (const auto& w : o.data().at("wrappers")) {
                     if (w.size() < 9) continue;
                     const auto at =
                         w[7].is_string() ? w[7].get<std::string>() : w[3].get<std::string>();
                     for (const auto& a : w[8]) {
                       if (a[1].get<bool>()) continue;
                       const auto alias = a[0].get<std::string>();
                       return fail(p,
                                   "the " + w[1].get<std::string>() + "'s alias '" + alias + "' " +
                                       (a[2].is_null() ? std::string("reaches nothing")
                                                       : "reaches a " + a[2].get<std::string>() +
                                                             ", not the module in its slot '" +
                                                             w[2].get<std::string>() + "'"),
                                   at.empty() ? alias : at + "." + alias);
                     }
                   }
                   return pass(p);
                 }});
  if (options.aliases.empty()) out.back().skip = "no alias declared (--alias)";
  out.push_back({"P17 training", true, plain,
                 [subject, tolerance](const gen::TreeSpec& spec, const Observed& o) {
                   const std::string p = "P17 training";
                   if (auto f = common_failure(p, o, subject)) return *f;
                   if (o.ranks.empty()) return training(p, spec, o.data(), tolerance);
                   // Every rank trained its own replica: each is judged, the first that fails
                   // named.
                   for (size_t r = 0; r < o.ranks.size(); ++r) {
                     auto v = training(p, spec, o.ranks[r], tolerance);
                     if (v.skipped) return v;
                     if (!v.passed) {
                       v.reason = "rank " + std::to_string(r) + ": " + v.reason;
                       return v;
                     }
                   }
                   return pass(p);
                 }});
  out.back().trains = true;
  // Each row is a property of the table, under its name, or one of certify-python's own (the
  // layout, the agreement with the C++ kinds); what the table does not run here it says why.
  for (auto& p : out) {
    if (p.name == "layout" || p.name == "C++ agreement") continue;
    const auto& info = props::property_info(p.name);
    if (info.python != p.name) {
      throw Error(ErrorCode::kInvalidArgument, p.name,
                  p.name + " is not a certify-python row in the property table");
    }
    p.per_dtype = info.numeric;
    p.trains = info.trains;
    const auto adjust = std::move(p.adjust);
    p.adjust = [adjust, draw = info.adjust](gen::GenOptions& g) {
      draw(g);
      adjust(g);
    };
  }
  return out;
}

std::string shell_quote(const std::string& s) {
  if (s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-:/=") ==
      std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// WRAPCERT_PYTHON_PRELOAD: the socket of a preloaded interpreter to start workers in, if any.
std::string preload_socket() {
  const char* path = std::getenv("WRAPCERT_PYTHON_PRELOAD");
  return path ? path : "";
}

/// The worker, or at world size N one worker per rank: each a torch.distributed rank on gloo,
/// started with the variables torchrun gives its workers, its store (c10d's TCPStore) served
/// here as torchrun's agent serves it. Every request goes to every rank; a rank's fault stops
/// the others and restarts all of them under a new attempt (a fresh rendezvous), as torchrun
/// restarts a failed group.
class Runner {
 public:
  explicit Runner(const Options& options) : options_(options) {
    WorkerOptions base{options.interpreter.empty() ? bridge::python() : options.interpreter,
                       (std::filesystem::path(worker_dir(options)) / "wrapcert_worker.py").string(),
                       options.timeout_seconds,
                       {},
                       options.start_timeout_seconds,
                       preload_socket()};
    if (options.world_size > 1) store_ = std::make_unique<StoreServer>(0);
    for (int rank = 0; rank < options.world_size; ++rank) {
      workers_.push_back(std::make_unique<Worker>(base));
      if (store_) environment(rank);
    }
  }

  /// Starts the workers (each rank joining the others) and checks every wrapper and the
  /// subject import.
  void start() {
    const auto o = exchange({{"op", "resolve"},
                             {"wrappers", options_.wrappers},
                             {"unwrap", options_.unwrap},
                             {"release", options_.release}});
    if (o.reply.fault != Fault::kNone) {
      throw Error(
          ErrorCode::kInvalidArgument, "",
          "the Python worker did not start: " + o.reply.message + "\n" + o.reply.stderr_tail);
    }
    if (!o.disagreement.empty()) throw Error(ErrorCode::kInvalidArgument, "", o.disagreement);
    if (!o.reply.body.value("ok", false)) {
      throw Error(ErrorCode::kInvalidArgument, o.reply.body.value("who", std::string()),
                  o.reply.body.value("error", std::string("the worker refused the run")));
    }
    torch_version_ = o.reply.body.value("torch", std::string());
  }

  /// What every case, fixture and repro request carries: the subject, the declarations, the
  /// seed and whether numerics run.
  json case_fields(bool numerics, uint64_t seed) const {
    auto text = [](const std::string& s) { return s.empty() ? json() : json(s); };
    return {{"unwrap", text(options_.unwrap)},
            {"release", text(options_.release)},
            {"aliases", options_.aliases},
            {"slots", options_.slots},
            {"seed", seed},
            {"numerics", numerics}};
  }

  /// One generated case: built, wrapped and unwrapped (with `numerics`, also run forward and
  /// backward); with `trains`, the training loop instead.
  const Observed& observe(const gen::TreeSpec& spec, bool numerics, uint64_t seed,
                          bool trains = false) {
    auto request = case_fields(numerics, seed);
    request["op"] = "case";
    request["spec"] = to_json(spec);
    if (trains) {
      request.update(training_fields(spec));
      request["reductions"] = options_.reductions;  // how the model trains across ranks
    }
    return call(request);
  }

  /// A fixture built in Python, every decoder layer and the root wrapped in each wrapper.
  const Observed& observe_fixture(const fixtures::CausalLMConfig& c, bool numerics, uint64_t seed) {
    json config = {
        {"architecture", c.architecture == fixtures::Architecture::kGemma ? "gemma" : "mistral"},
        {"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_layers", c.num_layers},
        {"num_heads", c.num_heads},
        {"num_kv_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"rms_norm_eps", c.rms_norm_eps},
        {"rope_theta", c.rope_theta},
        {"pad_token_id", c.pad_token_id ? json(*c.pad_token_id) : json()},
        {"tie_word_embeddings", c.tie_word_embeddings}};
    auto request = case_fields(numerics, seed);
    request["op"] = "fixture";
    request["config"] = std::move(config);
    request["wrappers"] = options_.wrappers;
    return call(request);
  }

  json repro_request(const gen::TreeSpec& spec, bool numerics, uint64_t seed,
                     bool trains = false) const {
    auto request = case_fields(numerics, seed);
    request["op"] = "repro";
    request["spec"] = to_json(spec);
    if (trains) request.update(training_fields(spec));
    request["world_size"] = options_.world_size;
    request["reductions"] = options_.reductions;
    request["owned_state"] = options_.owned_state;
    return request;
  }
  /// Rank 0's worker (a repro script is written by one rank alone: it runs no collective).
  Worker& worker() { return *workers_.front(); }
  const std::string& torch_version() const { return torch_version_; }
  int calls(int which) const { return calls_[which]; }
  double seconds(int which) const { return seconds_[which]; }
  int starts() const {
    int n = 0;
    for (const auto& w : workers_) n += w->starts();
    return n;
  }
  int preloaded_starts() const {
    int n = 0;
    for (const auto& w : workers_) n += w->preloaded_starts();
    return n;
  }

 private:
  const Observed& call(const json& request) {
    // Generated cases, structural (0), with numerics (1) and trained (3), and fixture cases
    // (2), apart.
    const int which = request.value("op", "") == "fixture" ? 2
                      : request.contains("steps")          ? 3
                                                           : request.value("numerics", false);
    const auto key = request.dump();
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (!request.value("numerics", true) && !request.contains("steps")) {
      // A case already run with numerics holds everything the structural rows read.
      auto numeric = request;
      numeric["numerics"] = true;
      if (auto it = memo_.find(numeric.dump()); it != memo_.end()) return it->second;
    }
    ++calls_[which];
    const auto start = Clock::now();
    auto o = exchange(request);
    seconds_[which] += std::chrono::duration<double>(Clock::now() - start).count();
    return memo_.emplace(key, std::move(o)).first->second;
  }

  /// torchrun's variables for `rank`, under the current attempt.
  void environment(int rank) {
    const auto world = std::to_string(options_.world_size);
    auto& w = *workers_[static_cast<size_t>(rank)];
    for (const auto& [name, value] : std::map<std::string, std::string>{
             {"RANK", std::to_string(rank)},
             {"LOCAL_RANK", std::to_string(rank)},
             {"GROUP_RANK", "0"},
             {"WORLD_SIZE", world},
             {"LOCAL_WORLD_SIZE", world},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(store_->port())},
             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
             {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt_)},
             // A rank waiting in a collective gives up first, so the one it waits for is the
             // one that is named as hung.
             {"WRAPCERT_COLLECTIVE_TIMEOUT", std::to_string(options_.timeout_seconds / 2)}}) {
      w.set_environment(name, value);
    }
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    w.set_environment("GLOO_SOCKET_IFNAME", interface && *interface ? interface : "lo");
  }

  /// Every rank's reply to `request`, merged.
  Observed exchange(const json& request) {
    if (workers_.size() == 1) return Observed{workers_.front()->call(request), {}, {}};
    const size_t n = workers_.size();
    std::vector<std::future<Reply>> pending;
    for (auto& w : workers_) {
      pending.push_back(
          std::async(std::launch::async, [&w, &request] { return w->call(request); }));
    }
    std::vector<std::optional<Reply>> replies(n);
    std::optional<size_t> faulted;  // the first rank to fault: the others are stopped
    for (size_t done = 0; done < n;) {
      for (size_t r = 0; r < n; ++r) {
        if (replies[r] ||
            pending[r].wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
          continue;
        }
        replies[r] = pending[r].get();
        ++done;
        if (replies[r]->fault != Fault::kNone && replies[r]->fault != Fault::kStopped && !faulted) {
          faulted = r;
          for (auto& w : workers_) w->interrupt();
        }
      }
    }
    Observed o;
    auto restart_all = [&] {
      ++attempt_;
      for (size_t r = 0; r < n; ++r) {
        workers_[r]->restart();
        environment(static_cast<int>(r));
      }
    };
    if (faulted) {
      o.reply = std::move(*replies[*faulted]);
      o.reply.message = "rank " + std::to_string(*faulted) + ": " + o.reply.message;
      restart_all();
      return o;
    }
    o.reply = std::move(*replies[0]);
    const bool ok0 = o.reply.body.value("ok", false);
    for (size_t r = 1; r < n && o.disagreement.empty(); ++r) {
      const auto& body = replies[r]->body;
      const std::string rank = "rank " + std::to_string(r);
      if (body.value("ok", false) != ok0) {
        o.disagreement =
            ok0 ? rank + " could not run the case (" + body.value("stage", std::string()) +
                      "): " + body.value("error", std::string()) + " where rank 0 ran it"
                : "rank 0 could not run the case (" + o.reply.body.value("stage", std::string()) +
                      "): " + o.reply.body.value("error", std::string()) + " where " + rank +
                      " ran it";
      } else if (ok0 && body.contains("case")) {
        for (const char* what : {"original", "wrapped", "unwrapped"}) {
          const auto& mine = body["case"];
          const auto& first = o.reply.body["case"];
          if (mine.contains(what) != first.contains(what) ||
              (mine.contains(what) && key_names(mine.at(what)) != key_names(first.at(what)))) {
            o.disagreement = rank + "'s " + what + " model has other keys than rank 0's";
            break;
          }
        }
      }
    }
    if (!o.disagreement.empty()) {
      restart_all();  // a collective may have been left half done
    } else if (ok0 && o.reply.body.contains("case")) {
      o.ranks.push_back(o.reply.body["case"]);
      for (size_t r = 1; r < n; ++r) o.ranks.push_back(std::move(replies[r]->body["case"]));
    }
    return o;
  }

  const Options& options_;
  std::unique_ptr<StoreServer> store_;
  std::vector<std::unique_ptr<Worker>> workers_;
  int attempt_ = 0;
  std::map<std::string, Observed> memo_;
  std::string torch_version_;
  int calls_[4] = {0, 0, 0, 0};
  double seconds_[4] = {0, 0, 0, 0};
};

/// A spec as an indented outline, for a case the worker could not print (it died on it).
void outline(const gen::NodeSpec& n, const std::string& name, int depth, std::string& out,
             std::optional<gen::Container> parent = std::nullopt) {
  // What the builders leave out: containers other than a block inside a Sequential, ModuleList
  // or ModuleDict, and an Embedding inside a Sequential.
  if (parent && *parent != gen::Container::kCustom) {
    if (n.type == gen::NodeSpec::Type::kContainer && n.container != gen::Container::kCustom) return;
    if (*parent == gen::Container::kSequential && n.type == gen::NodeSpec::Type::kLeaf &&
        n.leaf == gen::Leaf::kEmbedding) {
      return;
    }
  }
  out +=
      std::string(static_cast<size_t>(depth) * 2, ' ') + (name.empty() ? "" : "(" + name + "): ");
  switch (n.type) {
    case gen::NodeSpec::Type::kLeaf:
      out += leaf_name(n.leaf);
      if (n.tie >= 0 && (n.leaf == gen::Leaf::kLinear || n.leaf == gen::Leaf::kLinearNoBias ||
                         n.leaf == gen::Leaf::kEmbedding)) {
        out += " (weight tied to an earlier one)";
      }
      break;
    case gen::NodeSpec::Type::kShared:
      out += "a module built before (shared)";
      break;
    case gen::NodeSpec::Type::kContainer:
      out += n.container == gen::Container::kCustom ? "Block" : container_name(n.container);
      break;
  }
  if (!n.wrappers.empty()) out += " wrapped in " + joined(n.wrappers) + " (innermost first)";
  out += "\n";
  if (n.type != gen::NodeSpec::Type::kContainer) return;
  for (const auto& [child, spec] : n.children) outline(spec, child, depth + 1, out, n.container);
}

/// The counterexample as a reader wants it: the wrapped model as PyTorch printed it, its keys,
/// what the subject gave back, and the Python traceback where one was raised.
std::string describe(const gen::TreeSpec& spec, const Observed& o, bool generated = true) {
  std::string out;
  if (o.ok()) {
    const auto& d = o.data();
    // What the tree drew (PyTorch's print shows neither the dtype, the mode, the batch nor
    // which parameters are frozen), then the wrapped model.
    if (generated) {
      out += std::string("built in ") + gen::to_string(spec.dtype) + ", " +
             std::to_string(spec.dim) + " wide, run in " + (spec.eval ? "eval" : "training") +
             " mode on a batch of " + std::to_string(spec.batch);
      if (d.contains("steps")) {
        out += std::string(", trained with ") +
               (spec.optimizer == gen::Optimizer::kAdam ? "Adam" : "SGD(momentum=0.9)") +
               (spec.dtype == gen::Dtype::kFloat64 ? "" : " on float64 master weights");
      }
      out += "\n";
      std::string frozen;
      for (const auto& e : d.at("original")) {
        if (e.size() > 2 && !e[2].get<bool>()) {
          frozen += (frozen.empty() ? "" : ", ") + e[0].get<std::string>();
        }
      }
      if (!frozen.empty()) out += "frozen (requires_grad=False): " + frozen + "\n";
    }
    out += d.value("wrapped_tree", std::string()) + "\nwrapped keys:\n";
    for (const auto& [k, t] : keys_of(d.at("wrapped"))) out += "  " + k + "\n";
    if (d.contains("unwrapped")) {
      out += "unwrapped keys:\n";
      for (const auto& [k, t] : keys_of(d.at("unwrapped"))) out += "  " + k + "\n";
    }
    out += "model keys:\n";
    for (const auto& [k, t] : keys_of(d.at("original"))) out += "  " + k + "\n";
    if (!d.contains("original_modules")) return out;
    std::set<int64_t> objects;
    for (const auto& m : d.at("original_modules")) objects.insert(m[2].get<int64_t>());
    out += std::to_string(objects.size()) + " modules, " + std::to_string(d.at("wrappers").size()) +
           " wrappers";
    return out;
  }
  out += "the generated model, before wrapping:\n";
  outline(spec.root, "", 0, out);
  if (o.reply.fault != Fault::kNone) {
    out += o.reply.message + "\n";
  } else if (!o.disagreement.empty()) {
    out += o.disagreement + "\n";
  } else {
    out +=
        o.stage() + " (" + o.field("who") + "): " + o.field("error") + "\n" + o.field("traceback");
  }
  if (!o.reply.stderr_tail.empty()) out += "the worker's last output:\n" + o.reply.stderr_tail;
  return out;
}

}  // namespace

std::vector<std::string> row_names(const Options& options) {
  std::vector<std::string> out;
  for (const auto& p : python_properties(options)) out.push_back(p.name);
  return out;
}

std::string worker_dir(const Options& options) {
  if (!options.worker_dir.empty()) return options.worker_dir;
  if (const char* d = std::getenv("WRAPCERT_PYTHON_DIR"); d && *d) return d;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const auto& candidate :
         {exe.parent_path() / "share" / "wrapcert" / "python",
          exe.parent_path().parent_path() / "share" / "wrapcert" / "python"}) {
      if (std::filesystem::exists(candidate / "wrapcert_worker.py", ec)) return candidate.string();
    }
  }
  throw Error(ErrorCode::kInvalidArgument, "",
              "cannot find wrapcert_worker.py beside the executable; set WRAPCERT_PYTHON_DIR");
}

certify::Report certify_python(const Options& options, const certify::Listener& listener,
                               Stats* stats) {
  if (options.wrappers.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "", "certify-python needs at least one --wrapper");
  }
  certify::Report report;
  report.options.kinds = options.wrappers;
  report.options.cases = options.cases;
  report.options.max_size = options.max_size;
  report.options.seed = options.seed ? options.seed : std::random_device{}();
  report.options.timeout_seconds = static_cast<int>(options.timeout_seconds);
  // The subject is Python code in the worker; reports name it (it is never called here).
  report.options.custom_subject = [](const ModulePtr&) -> props::Unwrapped {
    throw Error(ErrorCode::kInvalidArgument, "", "a Python subject runs in the worker");
  };
  report.options.custom_subject_name =
      options.unwrap.empty() ? "reference (Python port)" : options.unwrap;
  const uint64_t seed = report.options.seed;

  for (const auto& [wrapper, kind] : options.models) {
    (void)Registry::global().resolve(kind);  // an unknown kind is an Error naming it
  }
  Runner runner(options);
  runner.start();
  detail::announce_configuration(seed);
  const std::string kind = joined(options.wrappers);
  std::string replay = "wrapcert certify-python";
  if (const char* path = std::getenv("PYTHONPATH"); path && *path) {
    replay = "PYTHONPATH=" + shell_quote(path) + " " + replay;
  }
  for (const auto& [w, names] : options.aliases) {
    for (const auto& n : names) replay += " --alias " + shell_quote(w + "=" + n);
  }
  if (!options.release.empty()) replay += " --release " + shell_quote(options.release);
  for (const auto& [w, names] : options.owned_state) {
    for (const auto& n : names) replay += " --owned-state " + shell_quote(w + "=" + n);
  }
  for (const auto& w : options.wrappers) replay += " --wrapper " + shell_quote(w);
  for (const auto& [w, s] : options.slots) replay += " --slot " + shell_quote(w + "=" + s);
  for (const auto& [w, k] : options.models) replay += " --models " + shell_quote(w + "=" + k);
  for (const auto& [w, how] : options.reductions) {
    replay += " --reduction " + shell_quote(w + "=" + how);
  }
  if (options.world_size > 1) replay += " --world-size " + std::to_string(options.world_size);
  if (options.tolerance > 0) {
    std::ostringstream t;
    t << std::setprecision(17) << options.tolerance;
    replay += " --tolerance " + t.str();
  }
  if (!options.unwrap.empty()) replay += " --unwrap " + shell_quote(options.unwrap);
  replay += " --seed " + std::to_string(seed) + " --cases " + std::to_string(options.cases);

  bool repro_written = false;
  std::vector<gen::Dtype> dtypes = options.dtypes;
  if (dtypes.empty()) dtypes = {gen::Dtype::kFloat64, gen::Dtype::kFloat32, gen::Dtype::kBFloat16};
  for (const auto& property : python_properties(options)) {
    std::vector<std::optional<gen::Dtype>> rows{std::nullopt};
    if (property.per_dtype) rows.assign(dtypes.begin(), dtypes.end());
    for (const auto& dtype : rows) {
      Entry entry;
      entry.kind = kind;
      entry.property = property.name;
      entry.target = options.world_size > 1 ? std::string(kGenerated) + ", world size " +
                                                  std::to_string(options.world_size)
                                            : std::string(kGenerated);
      if (dtype) entry.dtype = gen::to_string(*dtype);
      const std::string row_replay =
          replay + (dtype ? std::string(" --dtypes ") + gen::to_string(*dtype) : std::string());
      if (listener) listener(entry, false);
      if (!property.skip.empty()) {
        entry.status = Status::kSkipped;
        entry.reason = property.skip;
        entry.cases = 0;
        if (listener) listener(entry, true);
        report.entries.push_back(std::move(entry));
        continue;
      }
      const auto start = Clock::now();
      gen::GenOptions g;
      g.kinds = options.wrappers;
      // Every case in training or eval mode (P2 compares each module's mode too); the rows that
      // run the model in their dtype.
      g.eval_mode = true;
      if (dtype) g.dtypes = {*dtype};
      property.adjust(g);
      const auto trees = gen::trees(g);
      auto shrunk = std::make_shared<gen::TreeSpec>();
      auto verdict = std::make_shared<Verdict>();
      bool faulted = false;
      certify::Drawn drawn;                    // what the judged cases with a wrapper drew
      int runs = 0, refused = 0, wrapped = 0;  // wrapped: cases with a wrapper, refused or not
      std::map<std::string, int> refusals;     // reason -> cases
      std::optional<gen::TreeSpec> first_refused;
      const auto result = detail::check_quietly(
          kind + "." + property.name, seed, options.cases, options.max_size, [&] {
            const auto spec = *trees;
            // After a worker fault, shrinking stops: a smaller case that hangs too would cost
            // another time limit, and the case that faulted is the one to report.
            RC_PRE(!faulted);
            const auto& o = runner.observe(spec, property.numerics, seed, property.trains);
            // A child name PyTorch refuses ("modules": a method of nn.Module) has no Python case.
            RC_PRE(o.ok() || o.reply.fault != Fault::kNone || o.stage() != "unbuildable");
            if (has_wrappers(spec.root)) ++wrapped;
            if (!o.ok() && o.reply.fault == Fault::kNone && o.disagreement.empty() &&
                o.stage() == "wrap") {
              ++refused;  // a wrapper that refuses a module (DDP without parameters) is a skip
              ++refusals[o.field("who") + ": " + o.field("error")];
              if (!first_refused) first_refused = spec;
              RC_DISCARD("a wrapper refused the module");
            }
            ++runs;
            const auto v = property.check(spec, o);
            if (!v.passed) {
              *shrunk = spec;
              *verdict = v;
              faulted = o.reply.fault != Fault::kNone;
            }
            RC_PRE(!v.skipped);
            if (has_wrappers(spec.root)) {
              certify::add_drawn(drawn, spec, property.trains, options.world_size);
            }
            RC_ASSERT(v.passed);
          });
      entry.cases = runs;
      rc::detail::FailureResult failure;
      rc::detail::GaveUpResult gave_up;
      if (result.match(failure)) {
        entry.status = Status::kFailed;
        entry.reason = verdict->reason.empty() ? failure.description : verdict->reason;
        entry.key = verdict->key;
        entry.counterexample =
            describe(*shrunk, runner.observe(*shrunk, property.numerics, seed, property.trains));
        entry.replay = row_replay;
        if (!options.repro.empty() && !repro_written) {
          const auto r = runner.worker().call(
              runner.repro_request(*shrunk, property.numerics, seed, property.trains));
          if (r.fault == Fault::kNone && r.body.value("ok", false)) {
            write_file_atomically(options.repro, r.body.at("script").get<std::string>());
            entry.counterexample += "\nrepro script: " + options.repro;
            repro_written = true;
          }
        }
      } else if (result.match(gave_up)) {
        entry.status = Status::kSkipped;
        entry.reason = "too few generated cases apply: " + gave_up.description;
      }
      // Refusals by distinct reason, most frequent first.
      std::vector<std::pair<int, std::string>> by_count;
      for (const auto& [why, n] : refusals) by_count.emplace_back(n, why);
      std::sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      std::string reasons;
      for (const auto& [n, why] : by_count) {
        reasons += (reasons.empty() ? "" : "; ") + std::to_string(n) + " × " + why;
      }
      if (entry.status != Status::kFailed && wrapped > 0 && 2 * refused > wrapped) {
        entry.status = Status::kFailed;
        entry.reason = "the wrappers refused " + std::to_string(refused) + " of the " +
                       std::to_string(wrapped) +
                       " generated models that had a wrapper (more than half): " + reasons;
        entry.replay = row_replay;
        if (first_refused) {
          entry.counterexample = "the first model refused:\n";
          outline(first_refused->root, "", 0, entry.counterexample);
          if (!options.repro.empty() && !repro_written) {
            const auto r = runner.worker().call(runner.repro_request(*first_refused, false, seed));
            if (r.fault == Fault::kNone && r.body.value("ok", false)) {
              write_file_atomically(options.repro, r.body.at("script").get<std::string>());
              entry.counterexample += "repro script: " + options.repro;
              repro_written = true;
            }
          }
        }
      } else if (refused > 0 && entry.status != Status::kFailed) {
        entry.reason = std::to_string(refused) + " of " + std::to_string(wrapped) +
                       " generated models with a wrapper refused (" + reasons + ")";
      }
      if (g.wrappers) certify::set_coverage(entry, kind, drawn, dtype.has_value(), property.trains);
      entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (listener) listener(entry, true);
      report.entries.push_back(std::move(entry));
    }
  }
  if (options.fixtures) {
    // The fixture rows: one case each, the fixture's keys checked against the C++ fixture.
    gen::TreeSpec wrapped_fixture;  // what the checks read of a spec: that there are wrappers
    wrapped_fixture.root.wrappers = options.wrappers;
    for (const char* name : {"tiny-gemma", "tiny-mistral"}) {
      const auto config = fixtures::config_named(name);
      for (const auto& property : python_properties(options)) {
        // P9 runs on trees without wrappers; the layout row checks the fixture against C++.
        // P17 trains generated trees: the fixtures are built by the worker's own builder.
        if (property.name == "P9 no false positives" || property.name == "C++ agreement" ||
            property.trains || !property.skip.empty()) {
          continue;
        }
        Entry entry;
        entry.kind = kind;
        entry.property = property.name;
        entry.target = name;
        if (property.per_dtype) entry.dtype = "float64";  // the fixtures run in float64
        if (listener) listener(entry, false);
        const auto start = Clock::now();
        const auto& o = runner.observe_fixture(config, property.numerics, seed);
        Verdict v;
        if (property.name == "layout") {
          if (!o.ok()) {
            // A wrapper or the subject that fails is the other rows' finding; ranks that
            // disagree fail every row.
            v = o.reply.fault == Fault::kNone && o.disagreement.empty() && o.stage() != "build" &&
                        o.stage() != "run"
                    ? pass("layout")
                    : *common_failure("layout", o, "");
          } else {
            Keys want;
            for (const auto& item : state_dict(fixtures::make_causal_lm(config, {c10::kMeta}))) {
              want.emplace_back(item.key(), 0);
            }
            v = same_keys("layout", keys_of(o.data().at("original")), want,
                          "the fixture built in Python");
          }
        } else if (!o.ok() && o.reply.fault == Fault::kNone && o.stage() == "wrap") {
          v = pass(property.name);
          v.skipped = true;
          v.reason = "a wrapper refused the fixture: " + o.field("error");
        } else {
          v = property.check(wrapped_fixture, o);
        }
        entry.cases = 1;
        if (v.skipped) {
          entry.status = Status::kSkipped;
          entry.reason = v.reason;
        } else if (!v.passed) {
          entry.status = Status::kFailed;
          entry.reason = v.reason;
          entry.key = v.key;
          entry.counterexample = describe(wrapped_fixture, o, /*generated=*/false);
          entry.replay = replay;
        }
        entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (listener) listener(entry, true);
        report.entries.push_back(std::move(entry));
      }
    }
  }
  if (stats) {
    stats->structural_cases = runner.calls(0);
    stats->structural_seconds = runner.seconds(0);
    stats->numeric_cases = runner.calls(1);
    stats->numeric_seconds = runner.seconds(1);
    stats->fixture_cases = runner.calls(2);
    stats->fixture_seconds = runner.seconds(2);
    stats->training_cases = runner.calls(3);
    stats->training_seconds = runner.seconds(3);
    stats->worker_starts = runner.starts();
    stats->preloaded_starts = runner.preloaded_starts();
    stats->torch_version = runner.torch_version();
  }
  if (options.fixtures) {  // what the report names; the models were built by the worker
    for (const char* name : {"tiny-gemma", "tiny-mistral"}) {
      certify::Model model;
      model.name = name;
      model.numerics = true;
      report.options.models.push_back(std::move(model));
    }
  }
  return report;
}

}  // namespace wrapcert::python
