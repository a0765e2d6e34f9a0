#include <wrapcert/certify/detail/training.h>
#include <wrapcert/certify/properties.h>
#include <wrapcert/detail/blame.h>
#include <wrapcert/detail/path.h>
#include <wrapcert/detail/wrapper_state.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/io/detail/scratch.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/keys.h>
#include <wrapcert/layer.h>
#include <wrapcert/printer.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/wrap.h>

#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <rapidcheck.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>

namespace wrapcert::props {
namespace {

using detail::finite;
using detail::mode_difference;
using detail::Trainer;
using detail::unique_parameters;

Verdict pass(const char* property) {
  return Verdict{property, true, false, {}, {}};
}
Verdict fail(const char* property, std::string reason, std::string key = {}) {
  return Verdict{property, false, false, std::move(reason), std::move(key)};
}
Verdict skip(const char* property, std::string reason) {
  return Verdict{property, true, true, std::move(reason), {}};
}

/// Runs `fn`, turning an exception into a failed verdict that says who threw: a wrapper, the
/// model (as `call` and the tree builder noted it), or else the unwrap subject.
template <typename Fn>
Verdict guarded(const char* property, Fn&& fn) {
  (void)detail::take_blame();  // a note from before this property is not its own
  auto who = [] {
    const auto blamed = detail::take_blame();
    return (blamed.empty() ? std::string("the subject") : blamed) + " threw: ";
  };
  try {
    return fn();
  } catch (const Error& e) {
    return fail(property, who() + e.what(), e.key_path());
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));  // LibTorch appends a backtrace
    return fail(property, who() + what);
  }
}

/// The first difference between two key lists, or "" when equal (length and order).
std::string key_difference(const std::vector<std::string>& got,
                           const std::vector<std::string>& want, std::string& key) {
  const auto difference = first_key_difference(got, want);
  if (!difference) return {};
  key = difference->key();
  return difference->describe();
}

void reset_calls(const gen::Built& built) {
  for (const auto& w : built.wrappers) w->reset_calls();
}

/// The first tensor of `state` (the model's, by key) frozen otherwise than the same key of
/// `plain` (the model as built): a wrapper that unfreezes what fine-tuning froze, or freezes
/// what it trains.
std::optional<std::pair<std::string, std::string>> requires_grad_difference(
    const StateDict& state, const StateDict& plain) {
  for (const auto& item : state) {
    const auto* want = plain.find(item.key());
    if (!want || item.value().requires_grad() == want->requires_grad()) continue;
    return std::make_pair(item.key(), std::string("requires_grad is ") +
                                          (item.value().requires_grad() ? "True" : "False") +
                                          ", the model's " +
                                          (want->requires_grad() ? "True" : "False"));
  }
  return std::nullopt;
}

/// Sees through no wrapper: a view built with it shows a module's parameters a flat-parameter
/// wrapper holds where they belong, and nothing else changes.
const WrapperKind* see_nothing(const torch::nn::Module&) {
  return nullptr;
}

/// The wrapped model's entries that are the model's own tensors, in the wrapped model's order
/// and under its keys, parameters a flat-parameter wrapper holds shown where they belong (as
/// the real wrapper's full state dict shows them); the wrappers' own state left out.
StateDict model_entries(const ModulePtr& wrapped, const StateDict& original) {
  std::set<const void*> model;
  for (const auto& item : original) model.insert(item.value().unsafeGetTensorImpl());
  const auto all = ModuleView::build(wrapped, see_nothing).state_dict();
  StateDict out;
  for (const auto& item : all) {
    if (model.count(item.value().unsafeGetTensorImpl())) out.insert(item.key(), item.value());
  }
  return out;
}

/// Why `wrapped` (from `model_entries`) cannot be matched one to one with `original`: a tensor
/// of the model under more keys, or fewer, than the model has for it. Sets `key`.
std::string entry_count_difference(const StateDict& wrapped, const StateDict& original,
                                   std::string& key) {
  std::map<const void*, int> count;
  for (const auto& item : original) ++count[item.value().unsafeGetTensorImpl()];
  for (const auto& item : wrapped) {
    if (--count[item.value().unsafeGetTensorImpl()] < 0) {
      key = item.key();
      return "the wrapped model holds a tensor of the model under more keys than the model (" +
             std::to_string(wrapped.size()) + " keys for the model's " +
             std::to_string(original.size()) + ")";
    }
  }
  for (const auto& item : original) {
    if (count[item.value().unsafeGetTensorImpl()] > 0) {
      key = item.key();
      return "the wrapped model does not hold this tensor of the model";
    }
  }
  return {};
}

gen::TreeSpec shuffled(gen::TreeSpec spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::function<void(gen::NodeSpec&)> walk = [&](gen::NodeSpec& n) {
    if (!n.wrappers.empty()) {
      std::shuffle(n.wrappers.begin(), n.wrappers.end(), rng);
      n.wrappers.push_back(n.wrappers.front());  // a repetition
    }
    for (auto& c : n.children) walk(c.second);
  };
  walk(spec.root);
  return spec;
}

}  // namespace

Step step(const ModulePtr& run, const StateDict& params, const torch::Tensor& input,
          const char* who) {
  for (const auto& item : params) {
    if (item.value().requires_grad()) item.value().mutable_grad() = torch::Tensor();
  }
  for (auto& p : run->parameters()) {
    if (p.defined()) p.mutable_grad() = torch::Tensor();
  }
  auto out = call(*run, input);
  if (out.requires_grad()) {  // a tree of skipped parts may have none
    try {
      out.pow(2).sum().backward();
    } catch (...) {
      // Nothing in the model's own code runs in backward but what its modules recorded.
      detail::note_blame(std::string("the backward of ") + who);
      throw;
    }
  }
  return {out.detach(), model_gradients(run, params)};
}

bool close(const torch::Tensor& a, const torch::Tensor& b, double tolerance) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return tolerance == 0.0 ? a.equal(b) : torch::allclose(a, b, tolerance, tolerance);
}

namespace {
/// The largest absolute difference between two tensors of one shape, and the largest magnitude
/// in `want`, both in float64.
std::pair<double, double> largest_gap(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kDouble);
  return {(got.to(torch::kDouble) - w).abs().max().item<double>(), w.abs().max().item<double>()};
}
}  // namespace

/// " (largest difference D, relative R)" between two tensors of one shape, else empty.
std::string largest_difference(const torch::Tensor& got, const torch::Tensor& want) {
  if (!got.defined() || !want.defined() || got.sizes() != want.sizes()) return {};
  const auto [d, scale] = largest_gap(got, want);
  std::ostringstream out;
  out << " (largest difference " << d << ", " << (scale > 0 ? d / scale : 0.0)
      << " of the largest value)";
  return out.str();
}

bool same_grads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                double tolerance, size_t& where, double order_tolerance) {
  for (where = 0; where < a.size(); ++where) {
    if (a[where].defined() != b[where].defined()) return false;
    if (!a[where].defined() || close(a[where], b[where], tolerance)) continue;
    if (order_tolerance == 0.0 || a[where].sizes() != b[where].sizes()) return false;
    const auto [diff, largest] = largest_gap(a[where], b[where]);
    if (!(diff <= order_tolerance * std::max(1.0, largest))) return false;
  }
  return true;
}

std::vector<torch::Tensor> model_gradients(const ModulePtr& root, const StateDict& params) {
  // What the wrappers in the tree hold as their declared state: flat parameters among it.
  std::vector<torch::Tensor> flats;
  for (const auto& m : root->modules()) {
    const auto* kind = Registry::global().find(*m);
    if (!kind) continue;
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      if (kind->owns(p.key()) && p.value().defined() && p.value().has_storage()) {
        flats.push_back(p.value());
      }
    }
  }
  std::vector<torch::Tensor> grads;
  for (const auto& item : params) {
    const auto& p = item.value();
    torch::Tensor g = p.requires_grad() && p.grad().defined() ? p.grad().clone() : torch::Tensor();
    if (p.requires_grad() && p.has_storage()) {
      for (const auto& f : flats) {
        if (!f.is_contiguous() ||
            f.storage().unsafeGetStorageImpl() != p.storage().unsafeGetStorageImpl()) {
          continue;
        }
        const auto& fg = f.grad();
        if (fg.defined() && fg.is_contiguous() && fg.sizes() == f.sizes()) {
          const auto part =
              fg.as_strided(p.sizes(), p.strides(),
                            fg.storage_offset() + (p.storage_offset() - f.storage_offset()));
          // Also used outside the flat unit (a tie across it): that use's gradient is its own.
          g = g.defined() ? g + part : part.clone();
        }
        break;
      }
    }
    grads.push_back(g);
  }
  return grads;
}

std::string KeyDifference::describe() const {
  if (index < got_size && index < want_size) {
    return "key " + std::to_string(index) + " is '" + got + "', expected '" + want + "'";
  }
  return std::to_string(got_size) + " keys, expected " + std::to_string(want_size) +
         (got_size > want_size ? " (extra '" : " (missing '") + key() + "')";
}

std::optional<KeyDifference> first_key_difference(const std::vector<std::string>& got,
                                                  const std::vector<std::string>& want) {
  const size_t n = std::min(got.size(), want.size());
  size_t i = 0;
  while (i < n && got[i] == want[i]) ++i;
  if (i == n && got.size() == want.size()) return std::nullopt;
  KeyDifference difference;
  difference.index = i;
  difference.got = i < got.size() ? got[i] : "";
  difference.want = i < want.size() ? want[i] : "";
  difference.got_size = got.size();
  difference.want_size = want.size();
  return difference;
}

std::set<std::vector<std::string>> tie_groups(const StateDict& state) {
  std::map<const void*, std::vector<std::string>> by_tensor;
  for (const auto& item : state) {
    by_tensor[item.value().unsafeGetTensorImpl()].push_back(item.key());
  }
  std::set<std::vector<std::string>> groups;
  for (auto& [impl, ks] : by_tensor) {
    if (ks.size() > 1) groups.insert(ks);
  }
  return groups;
}

UnwrapSubject subject(BuiltinUnwrap s) {
  switch (s) {
    case BuiltinUnwrap::kReference:
      return [](const ModulePtr& wrapped) {
        const auto view = unwrap_reference(wrapped);  // built once: for the keys and the rewiring
        auto state = view.state_dict();
        auto scope = std::make_shared<ScopedUnwrap>(view);
        return Unwrapped{scope->root(), std::move(state), scope};
      };
    case BuiltinUnwrap::kLegacy:
      return [](const ModulePtr& wrapped) {
        auto root = unwrap_legacy(wrapped);
        return Unwrapped{root, state_dict(root), nullptr};
      };
    case BuiltinUnwrap::kDuckTyped:
      return [](const ModulePtr& wrapped) {
        auto root = unwrap_duck_typed(wrapped);
        return Unwrapped{root, state_dict(root), nullptr};
      };
  }
  throw Error(ErrorCode::kInvalidArgument, "", "unknown subject");
}

Translator reference_translator() {
  return [](const ModulePtr& wrapped) {
    auto tr = std::make_shared<KeyTranslator>(KeyTranslator::from_tree(wrapped));
    return [tr](const std::string& key) { return tr->to_clean(key); };
  };
}

Case::Case(const gen::TreeSpec& spec, const UnwrapSubject& u, bool watch)
    : spec_(spec), u_(u), watch_(watch) {}

Case::~Case() {
  // The subject's results first: a `ScopedUnwrap` restores the model it rewired.
  plain_unwrapped_.reset();
  unwrapped_.reset();
}

const gen::Built& Case::built() {
  if (!built_) built_ = std::make_unique<gen::Built>(gen::build(spec_));
  return *built_;
}

const gen::Built& Case::plain() {
  if (!plain_) plain_ = std::make_unique<gen::Built>(gen::build(spec_, {std::nullopt, 0, false}));
  return *plain_;
}

const Unwrapped& Case::unwrapped() {
  if (!unwrapped_) {
    if (watch_ && !before_ && !before_error_) {
      try {
        (void)before();
      } catch (...) {  // kept for P5: this caller reads the case for another property
      }
    }
    const auto& root = built().root;
    unwrapped_ = u_(root);
  }
  return *unwrapped_;
}

const Unwrapped& Case::plain_unwrapped() {
  if (!plain_unwrapped_) {
    const auto& root = plain().root;
    plain_unwrapped_ = u_(root);
  }
  return *plain_unwrapped_;
}

void Case::release() {
  if (unwrapped_) unwrapped_->keep_alive.reset();
  if (plain_unwrapped_) plain_unwrapped_->keep_alive.reset();
}

const Case::Before& Case::before() {
  if (before_error_) {
    if (!before_blame_.empty()) detail::note_blame(before_blame_);
    std::rethrow_exception(before_error_);
  }
  if (before_) return *before_;
  if (unwrapped_) {
    throw std::logic_error("the case was read by the subject before P5 watched it (Case: watch)");
  }
  try {
    const auto& b = built();
    Before before;
    before.tree = format_tree(b.root);
    before.keys = state_dict(b.root).keys();
    before.input = gen::sample_input(spec_, gen::scalar_type(spec_.dtype));
    try {
      before.output = call(*b.root, before.input).detach();
    } catch (const Error& e) {
      // A module shared between a flat-parameter unit and the rest of the model cannot run, in
      // real FSDP either.
      if (e.code() != ErrorCode::kWrapperState) throw;
      before.does_not_run = e.what();
    }
    before_ = std::move(before);
  } catch (...) {
    before_error_ = std::current_exception();
    before_blame_ = detail::take_blame();
    if (!before_blame_.empty()) detail::note_blame(before_blame_);
    throw;
  }
  return *before_;
}

namespace {
/// `check` on a case of its own: what the overloads taking a spec do. The properties of the
/// kinds (P14-P16) and P8 read no subject.
template <typename Check>
Verdict alone(const gen::TreeSpec& spec, const UnwrapSubject& u, Check check) {
  Case c(spec, u);
  return check(c);
}
const UnwrapSubject kNoSubject;
}  // namespace

Verdict GeneratedProperty::check(const gen::TreeSpec& spec, const UnwrapSubject& u,
                                 const Translator& translator) const {
  return alone(spec, u, [&](Case& c) { return check_case(c, translator); });
}

// clang-format off
Verdict exact_keys(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return exact_keys(c); }); }
Verdict identity(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return identity(c); }); }
Verdict ties(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return ties(c); }); }
Verdict backward(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return backward(c); }); }
Verdict non_mutation(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return non_mutation(c); }); }
Verdict laws(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return laws(c); }); }
Verdict legacy_agreement(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return legacy_agreement(c); }); }
Verdict translation(const gen::TreeSpec& s, const Translator& t) { return alone(s, kNoSubject, [&](Case& c) { return translation(c, t); }); }
Verdict no_false_positives(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return no_false_positives(c); }); }
Verdict round_trip(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return round_trip(c); }); }
Verdict graph_safety(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return graph_safety(c); }); }
Verdict order(const gen::TreeSpec& s, const UnwrapSubject& u, uint64_t shuffle_seed) { return alone(s, u, [=](Case& c) { return order(c, shuffle_seed); }); }
Verdict values(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return values(c); }); }
Verdict release(const gen::TreeSpec& s) { return alone(s, kNoSubject, [](Case& c) { return release(c); }); }
Verdict owned_state(const gen::TreeSpec& s) { return alone(s, kNoSubject, [](Case& c) { return owned_state(c); }); }
Verdict aliases(const gen::TreeSpec& s) { return alone(s, kNoSubject, [](Case& c) { return aliases(c); }); }
Verdict training_loop(const gen::TreeSpec& s, const UnwrapSubject& u) { return alone(s, u, [](Case& c) { return training_loop(c); }); }
// clang-format on

Verdict exact_keys(Case& c) {
  return guarded("P1 keys", [&] {
    const auto& built = c.built();
    const auto got = c.unwrapped().state.keys();
    std::string key;
    const auto diff = key_difference(got, built.original.keys(), key);
    return diff.empty() ? pass("P1 keys") : fail("P1 keys", diff, key);
  });
}

Verdict identity(Case& c) {
  return guarded("P2 identity", [&] {
    const auto& built = c.built();
    const auto& state = c.unwrapped().state;
    for (const auto& item : built.original) {
      const auto* got = state.find(item.key());
      if (!got) return fail("P2 identity", "the tensor is missing", item.key());
      if (!got->is_same(item.value())) {
        return fail("P2 identity", "not the model's own tensor (a copy?)", item.key());
      }
    }
    if (const auto d = requires_grad_difference(state, c.plain().original)) {
      return fail("P2 identity", d->second, d->first);
    }
    if (const auto d = mode_difference(c.unwrapped().root, !c.spec().eval)) {
      return fail("P2 identity", "a module of the unwrapped model is " + d->second,
                  d->first.empty() ? std::string("<root>") : d->first);
    }
    return pass("P2 identity");
  });
}

Verdict ties(Case& c) {
  return guarded("P3 ties", [&] {
    const auto& built = c.built();
    const auto before = tie_groups(built.original);
    const auto after = tie_groups(c.unwrapped().state);
    if (before == after) return pass("P3 ties");
    for (const auto& g : before) {
      if (!after.count(g)) return fail("P3 ties", "keys that shared one tensor no longer do", g[0]);
    }
    return fail("P3 ties", "keys share a tensor that did not before", after.begin()->front());
  });
}

Verdict backward(Case& c) {
  return guarded("P4 backward", [&] {
    const auto& spec = c.spec();
    const auto& built = c.built();
    const auto& plain = c.plain();
    const auto dtype = gen::scalar_type(spec.dtype);
    // A single example, a batch (of the spec's 1 to 5), and the single example again: a forward
    // path may hide a fault behind either size, or behind a first call (a cache).
    const auto single = gen::sample_input(spec, dtype, 0, 1);
    const std::vector<torch::Tensor> inputs = {single, gen::sample_input(spec, dtype, 0), single};
    // The plain model has no cache: its third step would repeat its first.
    std::vector<Step> expected;
    for (size_t i = 0; i < 2; ++i) expected.push_back(step(plain.root, plain.original, inputs[i]));
    expected.push_back(expected[0]);
    auto run = [&](const torch::Tensor& input, size_t i) {
      return " (" + std::string(i == 0 ? "first call" : "call " + std::to_string(i + 1)) +
             ", batch of " + std::to_string(input.size(0)) + ")";
    };
    // Declared tolerances are in machine epsilons of the dtype compared.
    const double tolerance = built.tolerance * gen::epsilon(spec.dtype);
    // A shared module or a tied weight gets its gradient as a sum of contributions that autograd
    // adds in an order set by the graph, and a wrapper's own nodes change that order: with three
    // or more contributions the sums differ in their last bits (one ulp has been seen). Where the
    // tree shares or ties, gradients are compared within 4(k + 2) epsilons (k shared nodes and
    // ties) of their largest magnitude (at least 1); a wrong gradient is off by far more.
    const auto counts = gen::stats(spec);
    const int sums = counts.shared + counts.ties;
    const double order_tolerance = sums > 0 ? 4.0 * (sums + 2) * gen::epsilon(spec.dtype) : 0.0;
    size_t where = 0;

    for (size_t i = 0; i < inputs.size(); ++i) {
      reset_calls(built);
      Step wrapped;
      try {
        wrapped = step(built.root, built.original, inputs[i], "the wrapped model");
      } catch (const Error& e) {
        // A module shared between a flat-parameter unit and the rest of the model cannot run,
        // in real FSDP either: the case does not apply.
        if (e.code() != ErrorCode::kWrapperState) throw;
        return skip("P4 backward", "the wrapped model does not run: " + std::string(e.what()));
      }
      for (const auto& w : built.wrappers) {
        if (w->calls() == 0) {
          return fail("P4 backward",
                      "the wrapped run skipped a " + w->kind_name() + run(inputs[i], i));
        }
      }
      if (built.changes_output) continue;  // by design: the unwrapped run is compared below
      if (!same_grads(wrapped.second, expected[i].second, tolerance, where, order_tolerance)) {
        return fail("P4 backward",
                    (wrapped.second[where].defined()
                         ? "a gradient through the wrappers differs" +
                               largest_difference(wrapped.second[where], expected[i].second[where])
                         : "no gradient through the wrappers reaches this parameter (nor the "
                           "part of a wrapper's flat parameter that holds it)") +
                        run(inputs[i], i),
                    built.original.keys()[where]);
      }
      if (!close(wrapped.first, expected[i].first, tolerance)) {
        return fail("P4 backward",
                    "the wrapped model's output differs from the model's" + run(inputs[i], i));
      }
    }

    // Flat parameters compute only once released: P14 runs the released model.
    if (built.needs_release) return pass("P4 backward");
    const auto& unwrapped = c.unwrapped();
    for (size_t i = 0; i < inputs.size(); ++i) {
      reset_calls(built);
      const auto got = step(unwrapped.root, built.original, inputs[i], "the unwrapped model");
      for (const auto& w : built.wrappers) {
        if (w->calls() != 0) {
          return fail("P4 backward", "the unwrapped run went through a " + w->kind_name());
        }
      }
      if (!same_grads(got.second, expected[i].second, 0.0, where)) {
        return fail("P4 backward", "a gradient of the unwrapped model differs" + run(inputs[i], i),
                    built.original.keys()[where]);
      }
      if (!got.first.equal(expected[i].first)) {
        return fail("P4 backward",
                    "the unwrapped model's output differs from the model's" + run(inputs[i], i));
      }
    }
    return pass("P4 backward");
  });
}

Verdict non_mutation(Case& c) {
  return guarded("P5 non-mutation", [&] {
    const auto& before = c.before();
    if (!before.does_not_run.empty()) {
      return skip("P5 non-mutation", "the wrapped model does not run: " + before.does_not_run);
    }
    const auto& built = c.built();
    (void)c.unwrapped();
    c.release();  // the result, and anything it kept alive, is gone after this line
    std::string key;
    const auto diff = key_difference(state_dict(built.root).keys(), before.keys, key);
    if (!diff.empty())
      return fail("P5 non-mutation", "the wrapped model's keys changed: " + diff, key);
    if (format_tree(built.root) != before.tree) {
      return fail("P5 non-mutation", "the wrapped model's tree changed");
    }
    reset_calls(built);
    const auto after = call(*built.root, before.input).detach();
    for (const auto& w : built.wrappers) {
      if (w->calls() == 0) {
        return fail("P5 non-mutation", "a " + w->kind_name() + " is no longer on the forward path");
      }
    }
    if (!after.equal(before.output)) {
      return fail("P5 non-mutation", "the wrapped model computes another output after unwrapping");
    }
    return pass("P5 non-mutation");
  });
}

Verdict laws(Case& c) {
  return guarded("P6 laws", [&] {
    const auto& plain = c.plain();
    const auto& same = c.plain_unwrapped();
    if (same.root != plain.root) return fail("P6 laws", "u(M) is not M for an unwrapped M");
    std::string key;
    auto diff = key_difference(same.state.keys(), plain.original.keys(), key);
    if (!diff.empty()) return fail("P6 laws", "u(M) changed M's keys: " + diff, key);

    const auto& once = c.unwrapped();
    const auto twice = c.subject()(once.root);
    diff = key_difference(twice.state.keys(), once.state.keys(), key);
    return diff.empty() ? pass("P6 laws")
                        : fail("P6 laws", "u(u(x)) differs from u(x): " + diff, key);
  });
}

Verdict legacy_agreement(Case& c) {
  return guarded("P7 legacy", [&] {
    const auto& built = c.built();
    // What the module legacy returns holds once released (parameters a flat-parameter wrapper
    // holds shown where they belong), as the reference view shows it.
    const auto legacy =
        ModuleView::build(unwrap_legacy(built.root), see_nothing).state_dict().keys();
    std::string key;
    const auto diff = key_difference(c.unwrapped().state.keys(), legacy, key);
    return diff.empty() ? pass("P7 legacy") : fail("P7 legacy", diff, key);
  });
}

Verdict translation(Case& c, const Translator& t) {
  return guarded("P8 translation", [&] {
    c.release();  // the model as built, not as a subject's result rewires it
    const auto& built = c.built();
    const auto wrapped = model_entries(built.root, built.original);
    if (wrapped.size() != built.original.size()) {
      std::string key;
      const auto diff = entry_count_difference(wrapped, built.original, key);
      return fail("P8 translation", diff, key);
    }
    const auto to_clean = t(built.root);
    std::set<std::string> seen;
    for (size_t i = 0; i < wrapped.size(); ++i) {
      const auto& w = wrapped[i];
      const auto& original = built.original[i];
      if (!w.value().is_same(original.value())) {
        return fail("P8 translation", "wrapped and original orders disagree", w.key());
      }
      const auto clean = to_clean(w.key());
      if (clean != original.key()) {
        return fail("P8 translation",
                    "translates to '" + clean + "', expected '" + original.key() + "'", w.key());
      }
      if (!removes_whole_components(w.key(), clean)) {
        return fail("P8 translation", "touches part of a component", w.key());
      }
      if (!seen.insert(clean).second) return fail("P8 translation", "not one-to-one", clean);
    }
    const auto inverse = KeyTranslator::from_tree(built.root);
    for (const auto& item : wrapped) {
      if (inverse.to_wrapped(inverse.to_clean(item.key())) != item.key()) {
        return fail("P8 translation", "the inverse does not round-trip", item.key());
      }
    }
    return pass("P8 translation");
  });
}

Verdict no_false_positives(Case& c) {
  return guarded("P9 no false positives", [&] {
    const auto& plain = c.plain();
    std::string key;
    const auto diff = key_difference(c.plain_unwrapped().state.keys(), plain.original.keys(), key);
    return diff.empty()
               ? pass("P9 no false positives")
               : fail("P9 no false positives", "a user module was unwrapped: " + diff, key);
  });
}

Verdict round_trip(Case& c) {
  return guarded("P10 round trip", [&] {
    const auto& spec = c.spec();
    const auto& built = c.built();
    const auto& saved = c.unwrapped().state;
    // Through bytes, as a checkpoint file would go.
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& item : saved) dict.insert(item.key(), item.value());
    const auto bytes = torch::pickle_save(dict);
    const auto loaded = torch::pickle_load(bytes).toGenericDict();

    const auto fresh = gen::build(spec, {std::nullopt, 99, false});  // other values
    std::set<std::string> used;
    torch::NoGradGuard no_grad;
    for (const auto& item : fresh.original) {
      if (!loaded.contains(item.key()))
        return fail("P10 round trip", "missing from the file", item.key());
      const auto t = loaded.at(item.key()).toTensor();
      if (t.sizes() != item.value().sizes() || t.scalar_type() != item.value().scalar_type()) {
        return fail("P10 round trip", "shape or dtype differs", item.key());
      }
      item.value().copy_(t);
      used.insert(item.key());
    }
    if (used.size() != loaded.size()) {
      for (const auto& entry : loaded) {
        if (!used.count(entry.key().toStringRef())) {
          return fail("P10 round trip", "unexpected key in the file", entry.key().toStringRef());
        }
      }
    }
    for (const auto& item : built.original) {
      if (!fresh.original[item.key()].equal(item.value())) {
        return fail("P10 round trip", "values differ after loading", item.key());
      }
    }
    // And into a fresh wrapped model through the inverse translation.
    const auto fresh_wrapped = gen::build(spec, {std::nullopt, 98, true});
    {
      const auto tr = KeyTranslator::from_tree(fresh_wrapped.root);
      const auto target = model_entries(fresh_wrapped.root, fresh_wrapped.original);
      if (target.size() != fresh_wrapped.original.size()) {
        std::string key;
        const auto diff = entry_count_difference(target, fresh_wrapped.original, key);
        return fail("P10 round trip", diff, key);
      }
      for (const auto& item : saved) {
        const auto* slot = target.find(tr.to_wrapped(item.key()));
        if (!slot) return fail("P10 round trip", "no wrapped key to load into", item.key());
        slot->copy_(item.value());
      }
      for (size_t i = 0; i < target.size(); ++i) {
        if (!target[i].value().equal(built.original[i].value())) {
          return fail("P10 round trip", "values differ in the wrapped model", target[i].key());
        }
      }
    }
    return pass("P10 round trip");
  });
}

Verdict deep_chain(const std::vector<std::string>& kinds, const UnwrapSubject& u, int depth) {
  // Every level, top first, so the chain is torn down one level at a time at the end (a
  // shared_ptr chain 10,000 deep would otherwise be destroyed by recursion).
  std::vector<ModulePtr> levels;
  auto verdict = guarded("P11 graph safety", [&] {
    if (kinds.empty() || depth < 1) {
      throw Error(ErrorCode::kInvalidArgument, "", "a deep chain needs kinds and a depth");
    }
    std::vector<KindRef> refs;
    for (const auto& name : kinds) refs.push_back(Registry::global().resolve(name));
    // Linear in `depth` whatever `make` does with the module it wraps: each wrapper is made
    // around a stand-in and then given the chain below through its slot. A kind whose `inner`
    // does not follow its slot is made around the chain itself.
    ModulePtr m = torch::nn::Linear(2, 2).ptr();
    levels.push_back(m);
    for (int i = 0; i < depth; ++i) {
      const auto& kind = refs[static_cast<size_t>(i) % refs.size()];
      ModulePtr wrapper;
      if (i > 0) {
        try {
          wrapper = kind.make(std::make_shared<torch::nn::IdentityImpl>());
          replace_child(*wrapper, kind.kind->slot, m);
          if (kind.kind->inner_of(*wrapper, "") != m) wrapper = nullptr;
        } catch (const std::exception&) {
          wrapper = nullptr;
        }
        (void)detail::take_blame();  // a stand-in's failure is not a verdict
      }
      if (!wrapper) {
        try {
          wrapper = kind.make(m);
        } catch (...) {
          detail::note_blame("the wrapper kind " + kind.name() + " (building a wrapper)");
          throw;
        }
      }
      m = wrapper;
      levels.push_back(m);
    }
    std::reverse(levels.begin(), levels.end());
    const auto got = u(m).state.keys();
    if (got != std::vector<std::string>{"weight", "bias"}) {
      std::string key;
      return fail(
          "P11 graph safety",
          "a " + std::to_string(depth) + "-deep chain of " +
              (kinds.size() == 1 ? kinds[0] : std::to_string(kinds.size()) + " kinds") +
              " did not unwrap to the leaf's keys: " + key_difference(got, {"weight", "bias"}, key),
          key);
    }
    return pass("P11 graph safety");
  });
  for (auto& level : levels) level.reset();  // top first: no deep recursion
  return verdict;
}

Verdict graph_safety(Case& c) {
  return guarded("P11 graph safety", [&] {
    // A cycle: the model made its own descendant. The subject must say so, not hang or crash.
    c.release();
    const auto& built = c.built();
    const auto plain_root = unwrap_reference(built.root).root().module;
    plain_root->register_module("back_to_root", built.root);
    struct BreakCycle {
      const ModulePtr& root;
      ~BreakCycle() { root->replace_module("back_to_root", torch::nn::Linear(1, 1).ptr()); }
    } break_cycle{plain_root};
    try {
      (void)c.subject()(built.root);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kCycle) return pass("P11 graph safety");
      return fail("P11 graph safety", std::string("a cycle gave another error: ") + e.what(),
                  e.key_path());
    } catch (const std::exception& e) {
      std::string what = e.what();
      return fail("P11 graph safety", "a cycle gave: " + what.substr(0, what.find('\n')));
    }
    return fail("P11 graph safety", "a cycle was not reported", "back_to_root");
  });
}

Verdict order(Case& c, uint64_t shuffle_seed) {
  return guarded("P12 order", [&] {
    const auto a = c.unwrapped().state.keys();
    const auto b = c.subject()(gen::build(shuffled(c.spec(), shuffle_seed)).root).state.keys();
    std::string key;
    const auto diff = key_difference(b, a, key);
    return diff.empty() ? pass("P12 order")
                        : fail("P12 order", "another order of the same wrappers: " + diff, key);
  });
}

Verdict values(Case& c) {
  return guarded("P13 values", [&] {
    const auto& expected = c.plain().original;  // same seed
    const auto& state = c.unwrapped().state;
    for (const auto& item : expected) {
      const auto* got = state.find(item.key());
      if (!got) return fail("P13 values", "missing", item.key());
      if (got->sizes() != item.value().sizes() ||
          got->scalar_type() != item.value().scalar_type()) {
        return fail("P13 values", "shape or dtype differs", item.key());
      }
      if (!got->equal(item.value())) return fail("P13 values", "values differ", item.key());
    }
    return pass("P13 values");
  });
}

namespace {

/// Each wrapper of `built` with its kind and a path it is reached by (the first one).
struct WrapperAt {
  std::shared_ptr<WrapperImpl> wrapper;
  const WrapperKind* kind;
  std::string path;
};

std::vector<WrapperAt> wrappers_at(const gen::Built& built) {
  std::map<const torch::nn::Module*, std::string> paths;
  for (const auto& item : built.root->named_modules())
    paths.emplace(item.value().get(), item.key());
  std::vector<WrapperAt> out;
  for (const auto& w : built.wrappers) {
    const auto* kind = Registry::global().find(*w);
    if (!kind) continue;
    const auto it = paths.find(w.get());
    out.push_back({w, kind, it == paths.end() ? std::string() : it->second});
  }
  return out;
}

std::string at_path(const std::string& path) {
  return path.empty() ? std::string("the root") : "'" + path + "'";
}

}  // namespace

Verdict release(Case& c) {
  return guarded("P14 release", [&] {
    c.release();  // the model as built, not as a subject's result rewires it
    const auto& spec = c.spec();
    const auto& built = c.built();
    const auto& plain = c.plain();  // same seed: the values
    const auto wrappers = wrappers_at(built);
    std::vector<ModulePtr> held;
    for (const auto& w : wrappers) held.push_back(w.kind->inner_of(*w.wrapper, w.path));

    const auto root = release_wrappers(built.root);
    try {
      const auto state = state_dict(root);
      std::string key;
      const auto diff = key_difference(state.keys(), built.original.keys(), key);
      if (!diff.empty()) return fail("P14 release", "the released model's keys: " + diff, key);
      for (size_t i = 0; i < state.size(); ++i) {
        const auto& got = state[i];
        if (!got.value().is_same(built.original[i].value())) {
          return fail("P14 release", "not the model's own tensor after release (a copy?)",
                      got.key());
        }
        const auto& want = plain.original[i].value();
        if (got.value().sizes() != want.sizes() || !got.value().equal(want)) {
          return fail("P14 release", "values differ after release", got.key());
        }
      }
      if (tie_groups(state) != tie_groups(built.original)) {
        return fail("P14 release", "ties differ after release", state[0].key());
      }
      if (const auto d = requires_grad_difference(state, plain.original)) {
        return fail("P14 release", "after release " + d->second, d->first);
      }
      if (const auto d = mode_difference(root, !spec.eval)) {
        return fail("P14 release", "a module of the released model is " + d->second,
                    d->first.empty() ? std::string("<root>") : d->first);
      }
      for (const auto& item : root->named_modules()) {
        if (const auto* kind = Registry::global().find(*item.value())) {
          return fail("P14 release", "a " + kind->name + " is still on a path after release",
                      item.key());
        }
      }
      for (size_t i = 0; i < wrappers.size(); ++i) {
        const auto& w = wrappers[i];
        const auto now = find_child(*w.wrapper, w.kind->slot);
        if (now != held[i]) {
          return fail("P14 release",
                      "the " + w.kind->name + " at " + at_path(w.path) +
                          " no longer holds the module in its slot after release",
                      detail::join_path(w.path, w.kind->slot));
        }
      }
      const auto again = unwrap_reference(built.root).state_dict().keys();
      const auto diff_again = key_difference(again, built.original.keys(), key);
      if (!diff_again.empty()) {
        return fail("P14 release",
                    "after release the wrapped model unwraps to other keys: " + diff_again, key);
      }
      for (const int64_t batch : {int64_t{1}, spec.batch}) {
        const auto input = gen::sample_input(spec, gen::scalar_type(spec.dtype), 0, batch);
        reset_calls(built);
        const auto expected = step(plain.root, plain.original, input);
        const auto got = step(root, built.original, input, "the released model");
        for (const auto& w : built.wrappers) {
          if (w->calls() != 0) {
            return fail("P14 release", "the released model still runs through a " + w->kind_name());
          }
        }
        size_t where = 0;
        if (!same_grads(got.second, expected.second, 0.0, where)) {
          return fail(
              "P14 release",
              "a gradient of the released model differs (batch of " + std::to_string(batch) + ")",
              built.original.keys()[where]);
        }
        if (!got.first.equal(expected.first)) {
          return fail("P14 release", "the released model's output differs (batch of " +
                                         std::to_string(batch) + ")");
        }
      }
      return pass("P14 release");
    } catch (const Error& e) {
      // The model was a tree before release: a cycle now is the releases' doing.
      if (e.code() == ErrorCode::kCycle) {
        std::set<std::string> names(built.kinds.begin(), built.kinds.end());
        std::string kinds;
        for (const auto& n : names) kinds += (kinds.empty() ? "" : ", ") + n;
        detail::note_blame("the release of the wrapper kinds (" + kinds +
                           ": the released model reaches itself)");
      }
      throw;
    }
  });
}

Verdict training_loop(Case& c) {
  constexpr const char* kName = "P17 training";
  return guarded(kName, [&] {
    const auto& spec = c.spec();
    // Copies of its own: the case's models are read as built by the other properties.
    const auto wrapped = gen::build(spec);
    const auto plain = gen::build(spec, {std::nullopt, 0, false});
    const auto dtype = gen::scalar_type(spec.dtype);
    // A kind that changes outputs by design trains otherwise: only its flags, its frozen
    // parameters and what it saves are compared.
    const bool compare = !wrapped.changes_output;
    // A kind that holds state its inner modules need (kNeedsRelease) may keep the parameters'
    // current values there until released: they are compared through what it computes and what
    // it saves, not read from the model's tensors after each step.
    const bool read_values = !wrapped.needs_release;
    const auto counts = gen::stats(spec);
    const int sums = counts.shared + counts.ties;
    const double eps = gen::epsilon(spec.dtype);
    // Adam divides by a gradient's running magnitude, so a gradient that a declared tolerance
    // leaves at 1e-17 instead of 0 would move by the learning rate: trees with a kind that
    // declares one train with SGD, whose step is linear in the gradient, and each step widens
    // the tolerance by the declared one.
    const auto optimizer_kind =
        wrapped.tolerance > 0 ? gen::Optimizer::kSgdMomentum : spec.optimizer;
    auto wrapped_parameters = unique_parameters(wrapped.root);
    {
      // Two of them over one storage: a weight tied across a flat-parameter unit's boundary is
      // both the flat tensor's piece and registered outside it, and any optimizer moves it once
      // for each. FSDP does not accept such a tie either: the case does not apply there.
      std::map<const void*, int> storages;
      for (const auto& p : wrapped_parameters) {
        if (p.has_storage()) ++storages[p.storage().unsafeGetStorageImpl()];
      }
      for (const auto& item : wrapped.original) {
        const auto& t = item.value();
        if (!t.has_storage() || storages[t.storage().unsafeGetStorageImpl()] < 2) continue;
        if (wrapped.needs_release) {
          return skip(kName, "a weight tied across a flat-parameter unit (" + item.key() +
                                 ") is stepped once for each holder, in FSDP too");
        }
        return fail(kName,
                    "the optimizer is given two parameters over this tensor's storage: each "
                    "step moves it twice",
                    item.key());
      }
    }
    // A parameter of the wrapped model that holds the model's parameters in a layout of its own
    // (a flat parameter). Stepped whole in float64, its update may differ from the pieces' in
    // the last bit (see `Trainer`): after k such steps, values, outputs and gradients are
    // compared within 4k epsilons of the larger of 1 and their largest magnitude.
    bool relayout = false;
    {
      std::set<const void*> model, storages;
      for (const auto& item : wrapped.original) {
        model.insert(item.value().unsafeGetTensorImpl());
        if (item.value().has_storage()) {
          storages.insert(item.value().storage().unsafeGetStorageImpl());
        }
      }
      for (const auto& p : wrapped_parameters) {
        relayout = relayout || (!model.count(p.unsafeGetTensorImpl()) && p.has_storage() &&
                                storages.count(p.storage().unsafeGetStorageImpl()));
      }
    }
    const bool layout_bits = relayout && spec.dtype == gen::Dtype::kFloat64;
    int optimizer_steps = 0;
    Trainer wrapped_optimizer(optimizer_kind, std::move(wrapped_parameters));
    Trainer plain_optimizer(optimizer_kind, unique_parameters(plain.root));

    const auto steps = training_steps(spec.batch);
    bool training = !spec.eval;
    std::string at;
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& s = steps[i];
      const double layout_tolerance = layout_bits ? 4.0 * optimizer_steps * eps : 0.0;
      const double tolerance =
          std::max(wrapped.tolerance * eps * static_cast<double>(i + 1), layout_tolerance);
      const double order_tolerance =
          std::max(sums > 0 ? 4.0 * (sums + 2) * eps * (i + 1) : 0.0, layout_tolerance);
      // Once an optimizer stepped gradients that a shared module or a tie let differ in their
      // last bits (P4), the parameters may differ by a rounding too, and so may what they
      // compute: values and outputs are then held to the gradients' tolerance.
      const double value_tolerance =
          optimizer_steps > 0 ? std::max(tolerance, order_tolerance) : tolerance;
      const auto input = gen::sample_input(spec, dtype, kTrainingInputSeed + i, s.batch);
      if (s.what == TrainingStep::What::kSwitchMode) training = !training;
      at = "step " + std::to_string(i + 1) + " of " + std::to_string(steps.size()) + ", " +
           (s.what == TrainingStep::What::kTrain
                ? std::string("forward, backward and ") + gen::to_string(optimizer_kind) + " step"
            : s.what == TrainingStep::What::kNoGrad ? std::string("a call under torch.no_grad()")
                                                    : std::string(training ? "train()" : "eval()") +
                                                          " through the wrappers, then a call") +
           " in " + (training ? "training" : "eval") + " mode on a batch of " +
           std::to_string(s.batch);
      try {
        if (s.what == TrainingStep::What::kTrain) {
          const auto got = step(wrapped.root, wrapped.original, input, "the wrapped model");
          const auto want = step(plain.root, plain.original, input);
          // Overflow (float16's largest is 65504) in the model itself: nothing to compare.
          if (!finite(want.first) || !std::all_of(want.second.begin(), want.second.end(), finite)) {
            return skip(kName, "the model's training diverged (" + at + ")");
          }
          if (compare) {
            size_t where = 0;
            if (!same_grads(got.second, want.second, tolerance, where, order_tolerance)) {
              return fail(kName,
                          at + ": " +
                              (got.second[where].defined()
                                   ? "a gradient through the wrappers differs" +
                                         largest_difference(got.second[where], want.second[where])
                                   : "no gradient through the wrappers reaches this parameter"),
                          wrapped.original.keys()[where]);
            }
            if (!close(got.first, want.first, value_tolerance)) {
              return fail(kName, at + ": the output through the wrappers differs" +
                                     largest_difference(got.first, want.first));
            }
          }
          detail::note_blame("the optimizer step over the wrapped model's parameters");
          wrapped_optimizer.step();
          (void)detail::take_blame();
          plain_optimizer.step();
          ++optimizer_steps;
        } else {
          torch::Tensor got, want;
          if (s.what == TrainingStep::What::kSwitchMode) {
            wrapped.root->train(training);
            plain.root->train(training);
          }
          {
            std::optional<torch::NoGradGuard> no_grad;
            if (s.what == TrainingStep::What::kNoGrad) no_grad.emplace();
            got = call(*wrapped.root, input).detach();
            want = call(*plain.root, input).detach();
          }
          if (!finite(want)) return skip(kName, "the model's training diverged (" + at + ")");
          if (compare && !close(got, want, value_tolerance)) {
            return fail(kName, at + ": the output through the wrappers differs" +
                                   largest_difference(got, want));
          }
        }
      } catch (const Error& e) {
        const auto blamed = detail::take_blame();
        // As in P4: a module shared between a flat-parameter unit and the rest of the model
        // cannot run, in FSDP either.
        if (e.code() == ErrorCode::kWrapperState) {
          return skip(kName, "the wrapped model does not run: " + std::string(e.what()));
        }
        return fail(kName,
                    at + ": " + (blamed.empty() ? std::string("the subject") : blamed) +
                        " threw: " + e.what(),
                    e.key_path());
      } catch (const std::exception& e) {
        const auto blamed = detail::take_blame();
        std::string what = e.what();
        return fail(kName, at + ": " + (blamed.empty() ? std::string("the subject") : blamed) +
                               " threw: " + what.substr(0, what.find('\n')));
      }
      if (const auto d = mode_difference(wrapped.root, training)) {
        return fail(kName, at + ": a module of the wrapped model is " + d->second,
                    d->first.empty() ? std::string("<root>") : d->first);
      }
      if (const auto d = requires_grad_difference(wrapped.original, plain.original)) {
        return fail(kName, at + ": " + d->second, d->first);
      }
      for (size_t k = 0; k < wrapped.original.size(); ++k) {
        const auto& got = wrapped.original[k].value();
        const auto& want = plain.original[k].value();
        if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
          return fail(kName, at + ": the tensor's shape or dtype changed",
                      wrapped.original[k].key());
        }
        if (compare && read_values && !close(got, want, std::max(tolerance, order_tolerance))) {
          return fail(kName,
                      at + ": the model's values differ from training without wrappers" +
                          largest_difference(got, want),
                      wrapped.original[k].key());
        }
      }
    }

    // The scenario wrapcert began with: the trained model unwrapped, saved in each format
    // trainers write (torch.save's, and safetensors as Transformers writes it: a tied weight
    // stored once), loaded into a fresh model, and run.
    at = "after the " + std::to_string(steps.size()) + " steps";
    StateDict saved;
    {
      const auto unwrapped = c.subject()(wrapped.root);
      for (const auto& item : unwrapped.state) saved.insert(item.key(), item.value().detach());
    }
    std::vector<std::pair<std::string, StateDict>> checkpoints;
    {
      c10::Dict<std::string, torch::Tensor> dict;
      for (const auto& item : saved) dict.insert(item.key(), item.value());
      const auto loaded = torch::pickle_load(torch::pickle_save(dict)).toGenericDict();
      StateDict back;
      for (const auto& item : loaded)
        back.insert(item.key().toStringRef(), item.value().toTensor());
      checkpoints.emplace_back("torch.save", std::move(back));
    }
    {
      // In memory where there is one: syncing a checkpoint to a disk cost a millisecond a case.
      const detail::ScratchFolder folder("wrapcert-p17", /*in_memory=*/true);
      const auto path = folder.path() + "/model.safetensors";
      save_safetensors(path, saved);
      checkpoints.emplace_back("safetensors", load_safetensors(path));
    }
    const auto probe = gen::sample_input(spec, dtype, kTrainingProbeSeed);
    torch::Tensor want;
    {
      torch::NoGradGuard no_grad;
      want = compare ? call(*plain.root, probe) : call(*release_wrappers(wrapped.root), probe);
    }
    if (!finite(want)) return skip(kName, "the model's training diverged (" + at + ")");
    const double tolerance =
        std::max({wrapped.tolerance * eps * static_cast<double>(steps.size() + 1),
                  layout_bits ? 4.0 * optimizer_steps * eps : 0.0,
                  sums > 0 ? 4.0 * (sums + 2) * eps * static_cast<double>(steps.size()) : 0.0});
    // One fresh model, built with other values; each checkpoint overwrites all of them.
    const auto fresh = gen::build(spec, {std::nullopt, kTrainingFreshSeed, false});
    fresh.root->train(training);
    for (const auto& [format, loaded] : checkpoints) {
      {
        torch::NoGradGuard no_grad;
        std::string key;
        const auto diff = key_difference(loaded.keys(), fresh.original.keys(), key);
        if (!diff.empty()) {
          return fail(kName, at + ": the " + format + " checkpoint of the trained model: " + diff,
                      key);
        }
        for (const auto& item : fresh.original) {
          const auto& t = loaded[item.key()];
          if (t.sizes() != item.value().sizes() || t.scalar_type() != item.value().scalar_type()) {
            return fail(kName, at + ": the " + format + " checkpoint's shape or dtype differs",
                        item.key());
          }
          item.value().copy_(t);
        }
      }
      torch::Tensor got;
      {
        torch::NoGradGuard no_grad;
        got = call(*fresh.root, probe);
      }
      if (!close(got, want, tolerance)) {
        return fail(kName, at + ": the trained model, unwrapped, saved with " + format +
                               " and loaded into a fresh model, computes otherwise than the "
                               "trained model" +
                               largest_difference(got, want));
      }
    }
    return pass(kName);
  });
}

Verdict owned_state(Case& c) {
  return guarded("P15 owned state", [&] {
    c.release();
    const auto& built = c.built();
    const auto wrappers = wrappers_at(built);
    // First what is held at all: everything besides the slot must be declared by name.
    for (const auto& w : wrappers) {
      if (const auto stray = detail::stray_state(*w.wrapper, *w.kind)) {
        return fail(
            "P15 owned state",
            w.kind->name + " holds a " + stray->what + " its kind does not declare in owned_state",
            detail::join_path(w.path, stray->name));
      }
    }
    // What a wrapper holds must not take a name the translation gives the module in its slot:
    // `w._slot.weight` becomes `w.weight`, and so would the wrapper's own `weight`.
    for (const auto& w : wrappers) {
      std::vector<std::string> held;
      for (const auto& item : w.wrapper->named_parameters(/*recurse=*/false))
        held.push_back(item.key());
      for (const auto& item : w.wrapper->named_buffers(/*recurse=*/false))
        held.push_back(item.key());
      for (const auto& item : w.wrapper->named_children()) {
        if (item.key() != w.kind->slot) held.push_back(item.key());
      }
      if (held.empty()) continue;
      const auto inner = w.kind->inner_of(*w.wrapper, w.path);
      for (const auto& key : unwrap_reference(inner).state_dict().keys()) {
        const auto first = key.substr(0, key.find('.'));
        if (std::find(held.begin(), held.end(), first) == held.end()) continue;
        const auto own = detail::join_path(w.path, first);
        return fail("P15 owned state",
                    w.kind->name + " holds '" + own +
                        "' as its own state, and the module in its slot has '" +
                        detail::join_path(detail::join_path(w.path, w.kind->slot), key) +
                        "', which the translation makes '" + detail::join_path(w.path, key) +
                        "': two entries under one key",
                    own);
      }
    }
    // Then what is declared must be the wrapper's own: none of the model's modules (as seen
    // through every wrapper's slot) and none of its tensors.
    std::set<const torch::nn::Module*> model_modules;
    const auto model = unwrap_reference(built.root);
    for (size_t i = 0; i < model.size(); ++i) model_modules.insert(model.node(i).module.get());
    std::set<const void*> model_tensors;
    for (const auto& item : built.original)
      model_tensors.insert(item.value().unsafeGetTensorImpl());
    for (const auto& w : wrappers) {
      const auto& kind = *w.kind;
      auto where = [&](const std::string& name) { return detail::join_path(w.path, name); };
      auto own_tensor = [&](const std::string& name, const torch::Tensor& t) {
        return model_tensors.count(t.unsafeGetTensorImpl()) == 0
                   ? pass("P15 owned state")
                   : fail("P15 owned state",
                          kind.name + " registers a tensor of the model as its own", where(name));
      };
      for (const auto& item : w.wrapper->named_parameters(/*recurse=*/false)) {
        if (!item.value().defined()) continue;
        if (auto v = own_tensor(item.key(), item.value()); !v.passed) return v;
      }
      for (const auto& item : w.wrapper->named_buffers(/*recurse=*/false)) {
        if (!item.value().defined()) continue;
        if (auto v = own_tensor(item.key(), item.value()); !v.passed) return v;
      }
      for (const auto& item : w.wrapper->named_children()) {
        if (item.key() == kind.slot) continue;
        const auto owned = ModuleView::of(item.value());
        for (size_t i = 0; i < owned.size(); ++i) {
          if (model_modules.count(owned.node(i).module.get())) {
            return fail("P15 owned state",
                        kind.name + " registers a module of the model a second time",
                        where(item.key()));
          }
        }
        for (const auto& t : state_dict(item.value())) {
          if (auto v = own_tensor(item.key() + "." + t.key(), t.value()); !v.passed) return v;
        }
      }
    }
    return pass("P15 owned state");
  });
}

Verdict aliases(Case& c) {
  return guarded("P16 aliases", [&] {
    c.release();
    const auto& built = c.built();
    for (const auto& w : wrappers_at(built)) {
      const auto in_slot = w.kind->inner_of(*w.wrapper, w.path);
      for (const auto& alias : w.kind->aliases) {
        ModulePtr reached;
        try {
          reached = w.kind->alias_of(*w.wrapper, alias, w.path);
        } catch (...) {
          detail::note_blame("the wrapper kind " + w.kind->name + " (resolving alias '" + alias +
                             "')");
          throw;
        }
        if (reached != in_slot) {
          return fail("P16 aliases",
                      w.kind->name + "'s alias '" + alias + "' reaches a " +
                          python_type_name(*reached) + " that is not the module in its slot '" +
                          w.kind->slot + "'",
                      detail::join_path(w.path, alias));
        }
      }
    }
    return pass("P16 aliases");
  });
}

const std::vector<GeneratedProperty>& generated_properties() {
  static const std::vector<GeneratedProperty> table = [] {
    using Stage = GeneratedProperty::Stage;
    using Check = std::function<Verdict(Case&, const Translator&)>;
    auto on_case = [](Verdict (*fn)(Case&)) -> Check {
      return [fn](Case& c, const Translator&) { return fn(c); };
    };
    // What each property is, how its cases are drawn and whether it runs the model come from
    // the property table; here is how it reads a case.
    auto property = [&](const char* id, Check check, Stage stage = Stage::kWhileUnwrapped) {
      const auto& info = property_info(id);
      GeneratedProperty p;
      p.name = info.name;
      p.checks = info.checks;
      p.check_case = std::move(check);
      p.adjust = info.adjust;
      p.numeric = info.numeric;
      p.trains = info.trains;
      p.stage = stage;
      return p;
    };
    std::vector<GeneratedProperty> table{
        property("P1", on_case(exact_keys)),
        property("P2", on_case(identity)),
        property("P3", on_case(ties)),
        property("P4", on_case(backward), Stage::kBeforeUnwrapped),
        property("P5", on_case(non_mutation), Stage::kEndsUnwrapped),
        property("P6", on_case(laws)),
        property("P7", on_case(legacy_agreement)),
        property(
            "P8", [](Case& c, const Translator& t) { return translation(c, t); },
            Stage::kAfterUnwrapped),
        property("P9", on_case(no_false_positives)),
        property("P10", on_case(round_trip)),
        property("P11", on_case(graph_safety), Stage::kChangesModel),
        property("P12",
                 [](Case& c, const Translator&) {
                   return order(c, *rc::gen::arbitrary<uint64_t>());  // the shuffle, drawn here
                 }),
        property("P13", on_case(values)),
        property("P14", on_case(release), Stage::kChangesModel),
        property("P15", on_case(owned_state), Stage::kAfterUnwrapped),
        property("P16", on_case(aliases), Stage::kAfterUnwrapped),
        property("P17", on_case(training_loop), Stage::kAfterUnwrapped),
    };
    // P17 trains copies of its own, built from the spec: sharing a case saves it nothing, and a
    // case it skips (a diverged run, a tie across a flat unit) would have it run again alone.
    table.back().shares_cases = false;
    auto& p7 = table[6];
    p7.shares_cases = false;
    auto& p9 = table[8];
    p9.wraps = false;
    p9.shares_cases = false;
    if (table.size() != property_table().size()) {
      throw Error(ErrorCode::kInvalidArgument, "", "a property of the table has no check");
    }
    return table;
  }();
  return table;
}

}  // namespace wrapcert::props
