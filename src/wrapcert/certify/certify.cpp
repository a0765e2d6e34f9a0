#include <wrapcert/certify/certify.h>
#include <wrapcert/certify/detail/quiet_check.h>
#include <wrapcert/certify/hardware.h>
#include <wrapcert/certify/properties.h>
#include <wrapcert/detail/blame.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/wrap.h>
#include <wrapcert/wrappers.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fcntl.h>
#include <poll.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>

namespace wrapcert::certify {
namespace {

using props::Verdict;
using Clock = std::chrono::steady_clock;

constexpr const char* kGenerated = "generated trees";
constexpr const char* kDeepChain = "10,000-deep chain";

/// In a check's child process, where it says which case runs now (so that a hang names it).
int g_progress_fd = -1;

/// One frame to the parent: a tag ('c' the case running now, 'v' the verdict), the length, the
/// bytes.
void write_frame(int fd, char tag, const std::string& bytes);

/// Who threw (as noted while the model ran or was built, else the unwrap subject) and the
/// message's first line: LibTorch appends a backtrace, a report wants the message.
std::string first_line(const std::string& text) {
  const auto who = detail::take_blame();
  return (who.empty() ? std::string("the subject or the fixture") : who) +
         " threw: " + text.substr(0, text.find('\n'));
}

Entry new_entry(const std::string& kind, const std::string& property, const std::string& target) {
  Entry entry;
  entry.kind = kind;
  entry.property = property;
  entry.target = target;
  return entry;
}

/// The kinds (or `Kind[mode]`s) the model `spec` builds holds, counted on the built model: a
/// spec names wrappers the builder may leave out (a skipped node, a list's own stack). Before
/// the check runs, in a child process, the case is sent to the parent, so that a hang names it.
/// Empty when the spec does not build (the check cannot run it either).
std::vector<std::string> kinds_held(props::Case& c) {
  try {
    const auto& built = c.built();
    if (g_progress_fd >= 0) write_frame(g_progress_fd, 'c', gen::describe(c.spec(), built));
    return built.kinds;
  } catch (const std::exception&) {
    (void)detail::take_blame();
    if (g_progress_fd >= 0) write_frame(g_progress_fd, 'c', gen::describe(c.spec()));
    return {};
  }
}

/// The trees certification draws for `kind` (in `dtype`, for P4, P13 and P14): the certified
/// kind as often as all built-in kinds and modes together; other kinds the process registered
/// (a plugin's siblings) are not drawn.
gen::GenOptions generation_options(const std::string& kind, std::optional<gen::Dtype> dtype) {
  gen::GenOptions g;
  g.kinds = Registry::with_builtins().names_with_modes();
  const size_t others = g.kinds.size();
  for (size_t i = 0; i < others; ++i) g.kinds.push_back(kind);
  if (dtype) {
    g.dtypes = {*dtype};
    g.eval_mode = true;
  }
  return g;
}

}  // namespace

void add_drawn(Drawn& d, const gen::TreeSpec& spec, bool trains, int64_t world_size) {
  ++(spec.eval ? d.eval : d.training);
  auto insert = [](std::vector<int64_t>& v, int64_t x) {
    const auto at = std::lower_bound(v.begin(), v.end(), x);
    if (at == v.end() || *at != x) v.insert(at, x);
  };
  insert(d.widths, spec.dim);
  insert(d.batches, spec.batch);
  const auto s = gen::stats(spec);
  d.frozen += s.frozen > 0;
  d.mode_leaves += s.mode_leaves > 0;
  d.cloneable += s.cloneable > 0;
  if (trains) ++(spec.optimizer == gen::Optimizer::kAdam ? d.adam : d.sgd);
  if (world_size > 1) {
    ++(spec.dim < world_size        ? d.empty_rows
       : spec.dim % world_size == 0 ? d.even_rows
                                    : d.uneven_rows);
  }
}

namespace {

/// `1-8` for a run without gaps, else the values: `1, 3, 5`.
std::string values_text(const std::vector<int64_t>& values) {
  if (values.empty()) return "none";
  const auto lo = values.front();
  const auto hi = values.back();
  if (values.size() > 2 && static_cast<int64_t>(values.size()) == hi - lo + 1) {
    return std::to_string(lo) + "-" + std::to_string(hi);
  }
  std::string out;
  for (const auto v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

/// "frozen parameters in 12", or "no frozen parameters drawn": a dimension a row never saw
/// says so.
std::string drawn_in(int cases, const std::string& what) {
  return cases > 0 ? what + " in " + std::to_string(cases) : "no " + what + " drawn";
}

}  // namespace

void set_coverage(Entry& entry, const std::string& kind, const Drawn& drawn, bool by_mode,
                  bool trains) {
  entry.drawn = drawn;
  entry.exercised = drawn.training + drawn.eval;
  entry.coverage = std::to_string(entry.exercised) + " of " + std::to_string(entry.cases) +
                   " cases held " + kind;
  if (by_mode) {
    entry.coverage += " (" + std::to_string(drawn.training) + " in training mode, " +
                      std::to_string(drawn.eval) + " in eval mode)";
  }
  if (entry.exercised == 0) return;
  entry.coverage += "; widths " + values_text(drawn.widths) + ", batches " +
                    values_text(drawn.batches) + ", " +
                    drawn_in(drawn.frozen, "frozen parameters") + ", " +
                    drawn_in(drawn.mode_leaves, "mode-dependent leaves") + ", " +
                    drawn_in(drawn.cloneable, "cloneable LibTorch leaves");
  if (trains) {
    entry.coverage += "; trained with SGD(momentum=0.9) in " + std::to_string(drawn.sgd) +
                      ", Adam in " + std::to_string(drawn.adam);
  }
}

namespace {

Entry run_generated(const std::string& kind, const props::GeneratedProperty& property,
                    const props::UnwrapSubject& subject, const props::Translator& translator,
                    const Options& options, std::optional<gen::Dtype> dtype) {
  Entry entry = new_entry(kind, property.name, kGenerated);
  if (dtype) entry.dtype = gen::to_string(*dtype);
  const auto start = Clock::now();
  auto g = generation_options(kind, dtype);
  property.adjust(g);
  const auto trees = gen::trees(g);
  auto shrunk = std::make_shared<gen::TreeSpec>();
  auto verdict = std::make_shared<Verdict>();
  auto runs = std::make_shared<int>(0);
  auto drawn = std::make_shared<Drawn>();  // what the cases that exercised the kind drew
  const auto result = detail::check_quietly(
      kind + "." + property.name, options.seed, options.cases, options.max_size, [&] {
        const auto spec = *trees;
        props::Case c(spec, subject);
        const auto held = kinds_held(c);
        const auto v = property.check_case(c, translator);
        ++*runs;
        if (!v.skipped && std::find(held.begin(), held.end(), kind) != held.end()) {
          add_drawn(*drawn, spec, property.trains);
        }
        if (!v.passed) {
          *shrunk = spec;  // shrinking accepts smaller failures in turn: the last is the minimum
          *verdict = v;
        }
        RC_PRE(!v.skipped);
        RC_ASSERT(v.passed);
      });
  entry.cases = *runs;
  if (property.wraps) {
    set_coverage(entry, kind, *drawn, dtype.has_value(), property.trains);
  }
  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  if (result.match(failure)) {
    entry.status = Status::kFailed;
    entry.reason = verdict->reason.empty() ? failure.description : verdict->reason;
    entry.key = verdict->key;
    entry.counterexample = gen::describe(*shrunk, verdict->key);
  } else if (entry.exercised == 0) {
    // A property the kind must satisfy that never ran on it proves nothing about it.
    entry.status = Status::kFailed;
    entry.reason = "not exercised: none of the " + std::to_string(entry.cases) +
                   " cases that ran this check held a " + kind +
                   " (raise --cases, or see why its cases were skipped)";
  } else if (result.match(gave_up)) {
    entry.status = Status::kSkipped;
    entry.reason = "too few generated cases apply: " + gave_up.description;
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// The properties `members` (which share cases, in table order) on one stream of generated
/// trees, each case built and observed once and read by every member in the order of their
/// stages. The same seed and generator give every member the trees it would draw alone. An
/// entry for each member that passed every case, skipped none and was exercised; none for the
/// others (all of them once one fails), which run again alone: a failure is then shrunk,
/// counted and replayed as the property's own.
std::vector<std::optional<Entry>> run_shared(
    const std::string& kind, const std::vector<const props::GeneratedProperty*>& members,
    const props::UnwrapSubject& subject, const props::Translator& translator,
    const Options& options, std::optional<gen::Dtype> dtype) {
  using Stage = props::GeneratedProperty::Stage;
  std::vector<std::optional<Entry>> out(members.size());
  const auto start = Clock::now();
  auto g = generation_options(kind, dtype);
  members.front()->adjust(g);  // the same for every member: they share cases
  const auto trees = gen::trees(g);
  std::vector<size_t> order(members.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return members[a]->stage < members[b]->stage; });
  const bool watch = std::any_of(members.begin(), members.end(),
                                 [](const auto* m) { return m->stage == Stage::kEndsUnwrapped; });
  struct Tally {
    int runs = 0;
    Drawn drawn;  // what the cases that held the kind drew
    bool skipped = false;
    double seconds = 0.0;  // in its own check
  };
  std::vector<Tally> tally(members.size());
  bool failed = false;
  const auto result =
      detail::check_quietly(kind + ".shared", options.seed, options.cases, options.max_size, [&] {
        const auto spec = *trees;
        if (failed) return;  // every member runs alone: the rest of the cases are not needed
        props::Case c(spec, subject, watch);
        const auto held = kinds_held(c);
        const bool holds = std::find(held.begin(), held.end(), kind) != held.end();
        for (const auto i : order) {
          const auto begin = Clock::now();
          const auto v = members[i]->check_case(c, translator);
          tally[i].seconds += std::chrono::duration<double>(Clock::now() - begin).count();
          ++tally[i].runs;
          if (!v.passed) {
            failed = true;
            return;
          }
          if (v.skipped) {
            tally[i].skipped = true;
          } else if (holds) {
            add_drawn(tally[i].drawn, spec, members[i]->trains);
          }
        }
      });
  rc::detail::SuccessResult success;
  if (failed || !result.match(success)) return out;
  double own = 0.0;
  for (const auto& t : tally) own += t.seconds;
  // Building and observing the cases, shared alike.
  const double common =
      std::max(0.0, std::chrono::duration<double>(Clock::now() - start).count() - own) /
      static_cast<double>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const auto& m = *members[i];
    if (tally[i].skipped) continue;  // alone, rapidcheck draws another case for each skipped
    Entry entry = new_entry(kind, m.name, kGenerated);
    if (dtype) entry.dtype = gen::to_string(*dtype);
    entry.cases = tally[i].runs;
    if (m.wraps) {
      set_coverage(entry, kind, tally[i].drawn, dtype.has_value(), m.trains);
      if (entry.exercised == 0) continue;  // alone, it says why
    }
    entry.seconds = tally[i].seconds + common;
    out[i] = std::move(entry);
  }
  return out;
}

/// P11 in depth, once per kind: a 10,000-deep chain of the kind in turn with the built-in kinds.
Entry run_deep_chain(const std::string& kind, const props::UnwrapSubject& subject) {
  Entry entry = new_entry(kind, "P11 graph safety", kDeepChain);
  const auto start = Clock::now();
  std::vector<std::string> kinds{kind};
  for (const auto& name : Registry::with_builtins().names()) {
    if (name != kind) kinds.push_back(name);
  }
  const auto verdict = props::deep_chain(kinds, subject);
  entry.cases = 1;
  if (!verdict.passed) {
    entry.status = Status::kFailed;
    entry.reason = verdict.reason;
    entry.key = verdict.key;
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// Every decoder layer and the root wrapped in `kind`.
ModulePtr wrap_fixture(const ModulePtr& model, const Model& config, const std::string& kind) {
  try {
    return auto_wrap(model, config.wrap_classes, Registry::global().resolve(kind).descriptor());
  } catch (...) {
    detail::note_blame("the wrapper kind " + kind + " (wrapping the fixture)");
    throw;
  }
}

std::vector<std::shared_ptr<WrapperImpl>> wrappers_in(const ModulePtr& root) {
  std::vector<std::shared_ptr<WrapperImpl>> out;
  const auto view = ModuleView::of(root);
  for (size_t i = 0; i < view.size(); ++i) {
    if (auto w = std::dynamic_pointer_cast<WrapperImpl>(view.node(i).module)) out.push_back(w);
  }
  return out;
}

const char* const kLayoutProperties[] = {"P1 keys", "P2 identity", "P3 ties"};

/// P1, P2 or P3 on a full-size fixture on the meta device, on a freshly built model.
Entry run_layout(const std::string& kind, const Model& config, const props::UnwrapSubject& subject,
                 const std::string& property) {
  Entry entry = new_entry(kind, property, config.name);
  const auto start = Clock::now();
  entry.cases = 1;
  (void)detail::take_blame();
  try {
    auto model = config.build(c10::kMeta, config.dtype);
    const auto original = state_dict(model);
    const auto state = subject(wrap_fixture(model, config, kind)).state;
    auto fail = [&entry](std::string reason, std::string key) {
      entry.status = Status::kFailed;
      entry.reason = std::move(reason);
      entry.key = std::move(key);
    };
    if (property == "P1 keys") {
      if (const auto d = props::first_key_difference(state.keys(), original.keys())) {
        fail("the unwrapped keys differ from the model's: " + d->describe(), d->key());
      }
    } else if (property == "P2 identity") {
      for (const auto& item : original) {
        const auto* got = state.find(item.key());
        if (!got || !got->is_same(item.value())) {
          fail(got ? "not the model's own tensor" : "missing", item.key());
          break;
        }
      }
    } else if (property == "P3 ties") {
      const auto want = props::tie_groups(original);
      const auto got = props::tie_groups(state);
      for (const auto& group : want) {
        if (!got.count(group)) {
          fail("tied keys no longer share one tensor", group.back());
          break;
        }
      }
      for (const auto& group : got) {
        if (entry.status != Status::kFailed && !want.count(group)) {
          fail("keys that were not tied share one tensor", group.back());
        }
      }
    }
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// P4 on a tiny fixture in `dtype`, in training and in eval mode, each on a first and a
/// repeated call: through every wrapper (gradients of flat-held parameters taken from their
/// part of the flat gradient) and through none.
Entry run_numerics(const std::string& kind, const Model& config,
                   const props::UnwrapSubject& subject, gen::Dtype dtype) {
  Entry entry = new_entry(kind, "P4 backward", config.name);
  entry.dtype = gen::to_string(dtype);
  const auto start = Clock::now();
  (void)detail::take_blame();
  const auto ref = Registry::global().resolve(kind);
  auto finish = [&] {
    entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return entry;
  };
  auto failed = [&](std::string reason) {
    entry.status = Status::kFailed;
    entry.reason = std::move(reason);
    return finish();
  };
  if (dtype == gen::Dtype::kFloat16) {
    entry.status = Status::kSkipped;
    entry.reason =
        "LibTorch 1.13 has no CPU kernels for float16 matrix products, softmax or rsqrt (the "
        "fixtures' layers); the generated trees cover float16";
    return finish();
  }
  const auto numerics = ref.numerics();
  const double tol =
      numerics == Numerics::kTolerance ? ref.kind->tolerance * gen::epsilon(dtype) : 0.0;
  const auto type = gen::scalar_type(dtype);
  try {
    const auto ids = torch::tensor({{3, 1, 4, 1, 5, 9}}, torch::kLong);
    for (const bool eval : {false, true}) {
      const std::string mode = eval ? "eval mode" : "training mode";
      auto plain = config.build(c10::kCPU, type);
      auto model = config.build(c10::kCPU, type);
      const auto params = state_dict(model);  // before wrapping: the clean keys
      auto wrapped = wrap_fixture(model, config, kind);
      auto wrappers = wrappers_in(wrapped);
      if (eval) {
        plain->eval();
        wrapped->eval();
      }
      const auto plain_params = state_dict(plain);
      auto grads_differ = [&](const std::vector<torch::Tensor>& got,
                              const std::vector<torch::Tensor>& want, double tolerance) {
        size_t where = 0;
        if (props::same_grads(got, want, tolerance, where)) return false;
        entry.key = params[where].key();
        return true;
      };
      for (const char* call_name : {"first call", "repeated call"}) {
        const auto expected = props::step(plain, plain_params, ids);
        const std::string at = " (" + mode + ", " + call_name + ")";
        // A kind that changes outputs by design around every decoder layer feeds the next one
        // what it does not take: only its unwrapped run is compared.
        if (numerics != Numerics::kChangesOutput) {
          for (const auto& w : wrappers) w->reset_calls();
          const auto got = props::step(wrapped, params, ids, "the wrapped model");
          for (const auto& w : wrappers) {
            if (w->calls() == 0) return failed("the wrapped run skipped a wrapper" + at);
          }
          if (!props::close(got.first, expected.first, tol)) {
            return failed("the wrapped run's output differs from the model's" + at);
          }
          if (grads_differ(got.second, expected.second, tol)) {
            return failed("the wrapped run's gradients differ from the model's" + at);
          }
        }
        ++entry.cases;
        // Flat parameters compute only once released: P14 runs the released model.
        if (numerics == Numerics::kNeedsRelease) continue;
        const auto u = subject(wrapped);
        for (const auto& w : wrappers) w->reset_calls();
        const auto run = props::step(u.root, params, ids, "the unwrapped model");
        for (const auto& w : wrappers) {
          if (w->calls() != 0) {
            return failed("the unwrapped run went through a " + w->kind_name() + at);
          }
        }
        if (!props::close(run.first, expected.first, 0.0) ||
            grads_differ(run.second, expected.second, 0.0)) {
          return failed("the unwrapped model's output or gradients differ from the model's" + at);
        }
      }
    }
    entry.exercised = entry.cases;
    entry.coverage = "training and eval mode, a first and a repeated call each";
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  }
  return finish();
}

/// P13 or P14 on a tiny fixture in `dtype`: the unwrapped state's values are the model's (P13);
/// releasing every wrapper gives back the model's own tensors, which compute as the model does
/// in training and eval mode (P14).
Entry run_fixture_state(const std::string& kind, const Model& config,
                        const props::UnwrapSubject& subject, gen::Dtype dtype,
                        const std::string& property) {
  Entry entry = new_entry(kind, property, config.name);
  entry.dtype = gen::to_string(dtype);
  const auto start = Clock::now();
  (void)detail::take_blame();
  auto failed = [&](std::string reason, std::string key = {}) {
    entry.status = Status::kFailed;
    entry.reason = std::move(reason);
    entry.key = std::move(key);
  };
  const auto type = gen::scalar_type(dtype);
  try {
    const auto plain = config.build(c10::kCPU, type);
    const auto expected = state_dict(plain);
    auto model = config.build(c10::kCPU, type);
    const auto original = state_dict(model);
    auto wrapped = wrap_fixture(model, config, kind);
    entry.cases = 1;
    if (property == "P13 values") {
      const auto state = subject(wrapped).state;
      for (const auto& item : expected) {
        const auto* got = state.find(item.key());
        if (!got) {
          failed("missing from the unwrapped state", item.key());
          break;
        }
        if (got->scalar_type() != item.value().scalar_type() ||
            got->sizes() != item.value().sizes() || !got->equal(item.value())) {
          failed("shape, dtype or values differ from the model's", item.key());
          break;
        }
      }
    } else {
      ModulePtr root;
      try {
        root = release_wrappers(wrapped);
      } catch (...) {
        detail::note_blame("the wrapper kind " + kind + " (releasing the fixture)");
        throw;
      }
      const auto state = state_dict(root);
      if (const auto d = props::first_key_difference(state.keys(), original.keys())) {
        failed("the released model's keys: " + d->describe(), d->key());
      }
      for (size_t i = 0; entry.status != Status::kFailed && i < state.size(); ++i) {
        if (!state[i].value().is_same(original[i].value())) {
          failed("not the model's own tensor after release (a copy?)", state[i].key());
        } else if (!state[i].value().equal(expected[i].value())) {
          failed("values differ after release", state[i].key());
        }
      }
      const auto ids = torch::tensor({{3, 1, 4, 1, 5, 9}}, torch::kLong);
      for (const bool eval : {false, true}) {
        if (entry.status == Status::kFailed || dtype == gen::Dtype::kFloat16) break;
        plain->train(!eval);
        root->train(!eval);
        const auto a = props::step(plain, expected, ids);
        const auto b = props::step(root, original, ids, "the released model");
        size_t where = 0;
        const bool same = props::close(a.first, b.first, 0.0) &&
                          props::same_grads(b.second, a.second, 0.0, where);
        if (!same) {
          failed(std::string("the released model computes otherwise than the model (") +
                 (eval ? "eval" : "training") + " mode)");
        }
        entry.cases += 1;
      }
      if (dtype == gen::Dtype::kFloat16) {
        entry.coverage = "tensors and values; no run (no CPU kernels for float16 in LibTorch 1.13)";
      }
    }
    if (entry.status != Status::kFailed) entry.exercised = entry.cases;
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

nlohmann::json drawn_to_json(const Drawn& d) {
  return {{"widths", d.widths},
          {"batches", d.batches},
          {"training", d.training},
          {"eval", d.eval},
          {"frozen", d.frozen},
          {"mode_leaves", d.mode_leaves},
          {"cloneable", d.cloneable},
          {"sgd", d.sgd},
          {"adam", d.adam},
          {"even_rows", d.even_rows},
          {"uneven_rows", d.uneven_rows},
          {"empty_rows", d.empty_rows}};
}

Drawn drawn_from_json(const nlohmann::json& j) {
  Drawn d;
  d.widths = j.at("widths").get<std::vector<int64_t>>();
  d.batches = j.at("batches").get<std::vector<int64_t>>();
  d.training = j.at("training").get<int>();
  d.eval = j.at("eval").get<int>();
  d.frozen = j.at("frozen").get<int>();
  d.mode_leaves = j.at("mode_leaves").get<int>();
  d.cloneable = j.at("cloneable").get<int>();
  d.sgd = j.at("sgd").get<int>();
  d.adam = j.at("adam").get<int>();
  d.even_rows = j.value("even_rows", 0);
  d.uneven_rows = j.value("uneven_rows", 0);
  d.empty_rows = j.value("empty_rows", 0);
  return d;
}

nlohmann::json to_json_value(const Entry& e) {
  return {{"kind", e.kind},
          {"property", e.property},
          {"target", e.target},
          {"dtype", e.dtype},
          {"exercised", e.exercised},
          {"coverage", e.coverage},
          {"status", static_cast<int>(e.status)},
          {"reason", e.reason},
          {"key", e.key},
          {"counterexample", e.counterexample},
          {"cases", e.cases},
          {"seconds", e.seconds},
          {"drawn", drawn_to_json(e.drawn)}};
}

Entry from_json_value(const nlohmann::json& j) {
  Entry e;
  e.kind = j.at("kind").get<std::string>();
  e.property = j.at("property").get<std::string>();
  e.target = j.at("target").get<std::string>();
  e.dtype = j.at("dtype").get<std::string>();
  e.exercised = j.at("exercised").get<int>();
  e.coverage = j.at("coverage").get<std::string>();
  e.status = static_cast<Status>(j.at("status").get<int>());
  e.reason = j.at("reason").get<std::string>();
  e.key = j.at("key").get<std::string>();
  e.counterexample = j.at("counterexample").get<std::string>();
  e.cases = j.at("cases").get<int>();
  e.seconds = j.at("seconds").get<double>();
  if (j.contains("drawn")) e.drawn = drawn_from_json(j.at("drawn"));
  return e;
}

void write_all(int fd, const std::string& bytes);

void write_frame(int fd, char tag, const std::string& bytes) {
  const auto length = static_cast<uint32_t>(bytes.size());
  std::string frame(5, tag);
  std::memcpy(&frame[1], &length, sizeof length);
  write_all(fd, frame + bytes);
}

void write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

/// LibTorch's intra-op threads set to one while it lives, and set back after: each check's
/// child process then starts with one thread, as it must, without starting a pool to shrink.
class OneThreadWhileChecking {
 public:
  explicit OneThreadWhileChecking(bool isolating) : before_(isolating ? at::get_num_threads() : 1) {
    if (before_ != 1) at::set_num_threads(1);
  }
  ~OneThreadWhileChecking() {
    if (before_ != 1) at::set_num_threads(before_);
  }
  OneThreadWhileChecking(const OneThreadWhileChecking&) = delete;
  OneThreadWhileChecking& operator=(const OneThreadWhileChecking&) = delete;

 private:
  int before_;
};

/// Why a child process gave no verdict: stopped as hung after `limit` seconds, killed by a
/// signal, or ended (with `status`) before sending one.
std::string how_it_ended(bool timed_out, int limit, int status, bool on_case) {
  const std::string shown = on_case ? " on the case shown" : "";
  if (timed_out)
    return "did not finish within " + std::to_string(limit) + " s: stopped as hung" + shown;
  if (WIFSIGNALED(status)) {
    return std::string("crashed: signal ") + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")" + shown;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    return "exited with status " + std::to_string(WEXITSTATUS(status)) + " before giving a verdict";
  }
  return "ended without a verdict";
}

/// How a child process ended: what it sent back, or why it sent nothing.
struct ChildOutcome {
  std::optional<std::string> verdict;  ///< the bytes `body` returned
  std::string failure;  ///< hung, crashed or exited early, and how; with `running` if known
  std::string running;  ///< the case that was running when it ended without a verdict
  std::vector<std::string> parts;  ///< the 'g' frames it sent before its verdict, in order
  double seconds = 0.0;
};

/// A pipe and a child process: returns the child's pid in the parent (which keeps `fds[0]`, the
/// read end) and 0 in the child (which keeps `fds[1]`). What is buffered for the console is
/// written first, so that neither process writes it again.
pid_t fork_with_pipe(int (&fds)[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("cannot isolate a check: ") + std::strerror(errno));
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("cannot isolate a check: ") + std::strerror(errno));
  }
  ::close(fds[pid == 0 ? 0 : 1]);
  return pid;
}

/// The state of LibTorch's default CPU generator when made; `restore` sets it back, so that
/// each check a child runs draws what it would draw in a child of its own.
class RandomState {
 public:
  RandomState() : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    state_ = generator_.get_state();
  }
  void restore() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(state_);
  }

 private:
  at::Generator generator_;  // a handle: the process's generator
  at::Tensor state_;
};

/// Runs `body` in a child process with a time limit; what it returns comes back through a
/// pipe. `body` must not throw. With `quiet_seconds`, the child is also stopped as hung once
/// that long passes without it starting another case.
ChildOutcome run_in_child(int timeout_seconds, const std::function<std::string()>& body,
                          int quiet_seconds = 0) {
  int fds[2];
  const auto start = Clock::now();
  const pid_t pid = fork_with_pipe(fds);
  if (pid == 0) {
    g_progress_fd = fds[1];
    // Only this thread survives the fork: a thread pool the parent had running (OpenMP's, after
    // any multi-threaded LibTorch op) would wait for workers that are not there. Where the
    // parent runs one thread already (`run` sees to it), setting it again would start a thread
    // pool for nothing: LibTorch rebuilds its pthreadpool after a fork, at its full size, to
    // shrink it.
    if (at::get_num_threads() != 1) at::set_num_threads(1);
    write_frame(fds[1], 'v', body());
    ::_exit(0);  // no exit handlers: they belong to the parent
  }
  std::string data;
  bool timed_out = false;
  const auto deadline = start + std::chrono::seconds(timeout_seconds);
  auto quiet_deadline = quiet_seconds > 0 ? start + std::chrono::seconds(quiet_seconds) : deadline;
  int limit = timeout_seconds;
  while (true) {
    const auto now = Clock::now();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::min(deadline, quiet_deadline) - now)
                          .count();
    if (left <= 0) {
      timed_out = true;
      if (quiet_deadline < deadline) limit = quiet_seconds;
      break;
    }
    pollfd in{fds[0], POLLIN, 0};
    const int ready = ::poll(&in, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[65536];
    const auto n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
    if (quiet_seconds > 0) quiet_deadline = Clock::now() + std::chrono::seconds(quiet_seconds);
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // The frames: the last case that started, and the verdict if one came.
  ChildOutcome out;
  std::optional<std::string> verdict;
  for (size_t at = 0; at + 5 <= data.size();) {
    uint32_t length = 0;
    std::memcpy(&length, data.data() + at + 1, sizeof length);
    if (at + 5 + length > data.size()) break;  // cut off by the kill
    auto frame = data.substr(at + 5, length);
    if (data[at] == 'c') {
      out.running = std::move(frame);
    } else if (data[at] == 'g') {
      out.parts.push_back(std::move(frame));
      out.running.clear();
    } else {
      verdict = std::move(frame);
    }
    at += 5 + length;
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (timed_out || !verdict || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    out.failure = how_it_ended(timed_out, limit, status, !out.running.empty());
  } else {
    out.verdict = std::move(verdict);
  }
  return out;
}

/// The row `check` gives, or `blank` failed with what it threw.
Entry checked(const Entry& blank, const std::function<Entry()>& check) {
  Entry entry = blank;
  try {
    entry = check();
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  } catch (...) {
    entry.status = Status::kFailed;
    entry.reason = "threw something that is not an exception";
  }
  return entry;
}

/// Runs `check` in a child process with a time limit; its entry comes back through a pipe. A
/// child that dies by a signal, exits without a verdict or outlives the limit is a failed entry
/// saying so.
Entry run_isolated(const Entry& blank, const Options& options,
                   const std::function<Entry()>& check) {
  const auto out = run_in_child(options.timeout_seconds,
                                [&] { return to_json_value(checked(blank, check)).dump(); });
  Entry entry = blank;
  entry.seconds = out.seconds;
  entry.status = Status::kFailed;
  entry.reason = out.failure;
  entry.counterexample = out.running;
  if (out.verdict) {
    try {
      return from_json_value(nlohmann::json::parse(*out.verdict));
    } catch (const nlohmann::json::exception&) {
      entry.reason = "ended without a verdict";
      entry.counterexample.clear();
    }
  }
  return entry;
}

/// What a check could leave changed in its process that the next check's verdict depends on:
/// LibTorch's process-wide modes and settings. (Its random numbers are set back before each
/// check instead.)
struct ProcessSettings {
  bool grad = true;
  bool inference = false;
  bool autocast = false;
  bool deterministic = false;
  int threads = 1;
  caffe2::TypeMeta dtype;

  static ProcessSettings now() {
    ProcessSettings s;
    s.grad = at::GradMode::is_enabled();
    s.inference = c10::InferenceMode::is_enabled();
    s.autocast = at::autocast::is_enabled() || at::autocast::is_cpu_enabled();
    s.deterministic = at::globalContext().deterministicAlgorithms();
    s.threads = at::get_num_threads();
    s.dtype = c10::get_default_dtype();
    return s;
  }
  bool operator==(const ProcessSettings& o) const {
    return grad == o.grad && inference == o.inference && autocast == o.autocast &&
           deterministic == o.deterministic && threads == o.threads && dtype == o.dtype;
  }
};

/// A group of properties that share their cases, in one dtype (none: the structural group).
struct Group {
  std::vector<const props::GeneratedProperty*> members;
  std::optional<gen::Dtype> dtype;
};

/// The groups' `run_shared` in child processes, one after another in one child as the checks
/// in `run_in_children` (each from the random state the child started with; a group that leaves
/// LibTorch's settings changed ends its child). A group's child is given the sum of its
/// members' time limits, and stopped as hung after one limit without starting a case. A group
/// that crashes, hangs or throws gives no entry: each member then runs alone, and isolated.
std::vector<std::vector<std::optional<Entry>>> run_shared_isolated(
    const std::string& kind, const std::vector<Group>& groups, const props::UnwrapSubject& subject,
    const props::Translator& translator, const Options& options) {
  std::vector<std::vector<std::optional<Entry>>> rows;
  for (const auto& group : groups) rows.emplace_back(group.members.size());
  auto parse = [&](size_t g, const std::string& part) {
    try {
      const auto j = nlohmann::json::parse(part);
      if (!j.is_array() || j.size() != groups[g].members.size()) return;
      std::vector<std::optional<Entry>> entries;
      for (const auto& e : j) {
        if (e.is_null()) {
          entries.emplace_back();
        } else {
          entries.emplace_back(from_json_value(e));
        }
      }
      rows[g] = std::move(entries);
    } catch (const nlohmann::json::exception&) {
    }
  };
  size_t next = 0;
  while (next < groups.size()) {
    int limit = 0;
    for (size_t g = next; g < groups.size(); ++g) {
      limit += options.timeout_seconds * static_cast<int>(groups[g].members.size());
    }
    const auto out = run_in_child(
        limit,
        [&]() -> std::string {
          RandomState random;
          const auto settings = ProcessSettings::now();
          for (size_t g = next; g < groups.size(); ++g) {
            random.restore();
            std::string part;
            try {
              auto j = nlohmann::json::array();
              for (const auto& entry : run_shared(kind, groups[g].members, subject, translator,
                                                  options, groups[g].dtype)) {
                j.push_back(entry ? to_json_value(*entry) : nlohmann::json());
              }
              part = j.dump();
            } catch (...) {
            }
            write_frame(g_progress_fd, 'g', part);
            if (!(ProcessSettings::now() == settings)) break;
          }
          return "done";
        },
        options.timeout_seconds);
    for (size_t k = 0; k < out.parts.size() && next + k < groups.size(); ++k) {
      parse(next + k, out.parts[k]);
    }
    // A group that crashed or hung gives nothing; one that ran none (it could not start) too.
    next += out.parts.size() + ((out.verdict && !out.parts.empty()) ? 0 : 1);
  }
  return rows;
}

/// A check of a run, in the order of the report: its row before it runs, and what runs it; or
/// the row a group of properties that shared their cases already gave.
struct Pending {
  Entry blank;
  std::function<Entry()> check;
  std::optional<Entry> given;
};

/// A child's part of `run_in_children`: runs `queue[todo[at]]`, `queue[todo[at + 1]]`, ... one
/// after another, each from the random state the child started with, and sends for each a
/// start frame ('s', its position in `todo`), the cases it runs ('c') and its row ('v'). Stops
/// after a row that failed or a check that left the process's settings changed.
[[noreturn]] void run_checks_here(int fd, const std::vector<Pending>& queue,
                                  const std::vector<size_t>& todo, size_t next) {
  g_progress_fd = fd;
  if (at::get_num_threads() != 1) at::set_num_threads(1);  // see run_in_child
  RandomState random;
  const auto settings = ProcessSettings::now();
  for (; next < todo.size(); ++next) {
    random.restore();
    write_frame(fd, 's', std::to_string(next));
    const auto entry = checked(queue[todo[next]].blank, queue[todo[next]].check);
    write_frame(fd, 'v', to_json_value(entry).dump());
    if (entry.status == Status::kFailed || !(ProcessSettings::now() == settings)) break;
  }
  ::_exit(0);  // no exit handlers: they belong to the parent
}

/// Runs the checks `todo` of `queue` (positions in it, in order) in child processes, calling
/// `started` as each starts and `finished` with its row. A child runs checks one after another
/// until one fails, crashes, hangs (`options.timeout_seconds` from its start) or leaves
/// LibTorch's settings changed; the next check then starts in a new child. A check that fails
/// in a child where others ran before it runs again alone, in a new child, and that run gives
/// its row: no row depends on what ran before it in the same process.
void run_in_children(const std::vector<Pending>& queue, const std::vector<size_t>& todo,
                     const Options& options, const std::function<void(size_t)>& started,
                     const std::function<void(size_t, Entry)>& finished) {
  const int limit = options.timeout_seconds;
  auto alone = [&](size_t i) {
    const auto& p = queue[i];
    return run_isolated(p.blank, options, p.check);
  };
  size_t next = 0;
  while (next < todo.size()) {
    int fds[2];
    const pid_t pid = fork_with_pipe(fds);
    if (pid == 0) run_checks_here(fds[1], queue, todo, next);
    std::string data;
    size_t parsed = 0;
    constexpr size_t kNone = static_cast<size_t>(-1);
    size_t current = kNone;       // the position in `todo` of the check running now
    std::optional<Entry> failed;  // a failed row of `current`, before it is confirmed
    size_t ran = 0;               // checks this child finished
    std::string running;
    auto start = Clock::now();
    bool timed_out = false;
    bool ended = false;
    while (!ended && !failed) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            start + std::chrono::seconds(limit) - Clock::now())
                            .count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      pollfd in{fds[0], POLLIN, 0};
      const int ready = ::poll(&in, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (ready <= 0) continue;
      char buffer[65536];
      const auto n = ::read(fds[0], buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ended = true;
        continue;
      }
      data.append(buffer, static_cast<size_t>(n));
      while (!failed && parsed + 5 <= data.size()) {
        uint32_t length = 0;
        std::memcpy(&length, data.data() + parsed + 1, sizeof length);
        if (parsed + 5 + length > data.size()) break;
        const char tag = data[parsed];
        auto frame = data.substr(parsed + 5, length);
        parsed += 5 + length;
        if (tag == 'c') {
          running = std::move(frame);
        } else if (tag == 's') {
          current = std::stoul(frame);
          running.clear();
          start = Clock::now();
          started(todo[current]);
        } else if (tag == 'v' && current != kNone) {
          Entry entry = queue[todo[current]].blank;
          try {
            entry = from_json_value(nlohmann::json::parse(frame));
          } catch (const nlohmann::json::exception&) {
            entry.status = Status::kFailed;
            entry.reason = "ended without a verdict";
          }
          if (entry.status == Status::kFailed) {
            failed = std::move(entry);
            break;
          }
          finished(todo[current], std::move(entry));
          ++ran;
          next = current + 1;
          current = kNone;
          start = Clock::now();
        }
      }
    }
    ::close(fds[0]);
    if (timed_out || failed) ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (current == kNone && !failed) {
      if (ended && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ran > 0) continue;
      if (next == todo.size()) break;  // it ended after the last row: every row is in
      // Ended between two checks, or before the first: the next check in a child of its own.
      const auto i = todo[next++];
      if (ran == 0) {
        // Nothing ran in it: that check is what it was running, as in a child of its own.
        started(i);
        Entry entry = queue[i].blank;
        entry.status = Status::kFailed;
        entry.reason = how_it_ended(timed_out, limit, status, false);
        entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        finished(i, std::move(entry));
      } else {
        started(i);
        finished(i, alone(i));
      }
      continue;
    }
    const auto i = todo[current];
    next = current + 1;
    if (ran > 0) {
      finished(i, alone(i));  // confirmed in a process where nothing ran before it
      continue;
    }
    if (failed) {
      finished(i, std::move(*failed));
      continue;
    }
    Entry entry = queue[i].blank;
    entry.status = Status::kFailed;
    entry.reason = how_it_ended(timed_out, limit, status, !running.empty());
    entry.counterexample = running;
    entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    finished(i, std::move(entry));
  }
}

/// What runs the check of `entry` again: the command line, or, for what only the API can
/// give (a kind registered by the caller, a subject or translator of one's own), the call.
std::string replay_command(const Entry& entry, const Options& options) {
  const auto builtins = Registry::with_builtins().names_with_modes();
  const bool builtin = std::find(builtins.begin(), builtins.end(), entry.kind) != builtins.end();
  std::string settings = "seed " + std::to_string(options.seed) + ", " +
                         std::to_string(options.cases) + " cases, max size " +
                         std::to_string(options.max_size);
  if (!entry.dtype.empty()) settings += ", dtypes {" + entry.dtype + "}";
  settings += ", properties {\"" + entry.property.substr(0, entry.property.find(' ')) + "\"}";
  if (options.custom_subject || options.custom_translator ||
      (!builtin && options.plugins.empty())) {
    std::string call = "certify::run(";
    call +=
        builtin ? "Options{.kinds = {\"" + entry.kind + "\"}}" : "<the kind " + entry.kind + ">";
    call += ") with " + settings;
    if (options.custom_subject) call += ", the subject '" + options.custom_subject_name + "'";
    if (options.custom_translator) {
      call += ", the translator '" + options.custom_translator_name + "'";
    }
    return call + ", on " + target_label(entry);
  }
  // `Kind[mode]` is a glob to a shell: quoted.
  auto quoted = [](const std::string& word) {
    const bool plain = word.find_first_not_of(
                           "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./-"
                           ",") == std::string::npos;
    return plain ? word : "'" + word + "'";
  };
  std::string out = "wrapcert certify";
  for (const auto& plugin : options.plugins) out += " --plugin " + quoted(plugin);
  out += " --wrappers " + quoted(entry.kind) + " --subject " + subject_name(options) + " --seed " +
         std::to_string(options.seed);
  if (!entry.dtype.empty()) out += " --dtypes " + entry.dtype;
  out += " --properties " + entry.property.substr(0, entry.property.find(' '));
  if (entry.target == kDeepChain) {
    out += " --cases 1 --fixtures tiny-gemma";  // every run checks the chain; this one is short
  } else if (entry.target == kGenerated) {
    out += " --cases " + std::to_string(options.cases) + " --max-size " +
           std::to_string(options.max_size);
  } else {
    out += " --fixtures " + entry.target;
  }
  return out;
}

}  // namespace

std::string target_label(const Entry& entry) {
  return entry.dtype.empty() ? entry.target : entry.target + " (" + entry.dtype + ")";
}

std::string subject_name(const Options& options) {
  return options.custom_subject ? options.custom_subject_name
                                : std::string(to_string(options.subject));
}

const char* to_string(Status status) {
  switch (status) {
    case Status::kPassed:
      return "passed";
    case Status::kFailed:
      return "failed";
    case Status::kSkipped:
      return "skipped";
  }
  return "unknown";
}

bool Report::passed() const {
  return count(Status::kFailed) == 0;
}

size_t Report::count(Status status) const {
  size_t n = 0;
  for (const auto& e : entries) n += e.status == status;
  return n;
}

Report run(const Options& options, const Listener& listener) {
  Report report;
  report.options = options;
  if (report.options.kinds.empty()) report.options.kinds = Registry::global().names_with_modes();
  for (const auto& kind : report.options.kinds) {
    const auto ref = Registry::global().resolve(kind);  // validates the name
    if (ref.mode && ref.mode->ranks_only) {
      throw Error(ErrorCode::kInvalidArgument, kind,
                  kind + " differs from " + ref.kind->name +
                      " only across ranks: certify it at a world size above one (--world-size, "
                      "certify::run_ranks)");
    }
  }
  for (const auto& property : options.properties) {
    bool known = property == "P11" || property == "P11 graph safety";
    for (const auto& p : props::generated_properties()) {
      known = known || property == p.name || property == p.name.substr(0, p.name.find(' '));
    }
    if (!known) {
      throw Error(ErrorCode::kInvalidArgument, property,
                  "unknown property '" + property + "' (P1 to P16, or a full name)");
    }
  }
  if (options.cases < 1 || options.max_size < 1 || options.timeout_seconds < 1) {
    throw Error(ErrorCode::kInvalidArgument, "",
                "cases, max_size and timeout_seconds must be positive");
  }
  for (const auto& model : options.models) {
    if (model.name.empty() || !model.build) {
      throw Error(ErrorCode::kInvalidArgument, model.name,
                  "a model to certify on needs a name and a build function");
    }
  }
  if (report.options.seed == 0) report.options.seed = std::random_device{}() | 1ULL;
  if (report.options.dtypes.empty()) {
    report.options.dtypes.assign(std::begin(gen::kAllDtypes), std::end(gen::kAllDtypes));
  }

  const auto subject =
      options.custom_subject ? options.custom_subject : props::subject(options.subject);
  const auto translator =
      options.custom_translator ? options.custom_translator : props::reference_translator();
  const auto& o = report.options;
  // rapidcheck reads RC_PARAMS (and says so) once per process: here, not in every child.
  detail::announce_configuration(o.seed);
  const OneThreadWhileChecking one_thread(o.isolate);
  // Rows already given by a group of properties that shared their cases, by property and dtype.
  std::map<std::tuple<std::string, std::string, std::string>, Entry> shared;
  // A kind's checks, queued in the order of the report and run together: in children (as few
  // as `run_in_children` can), or here with `isolate` off.
  std::vector<Pending> queue;
  auto run = [&](const Entry& blank, std::function<Entry()> check) {
    const auto given = shared.find({blank.property, blank.target, blank.dtype});
    queue.push_back({blank, std::move(check),
                     given != shared.end() ? std::optional<Entry>(given->second) : std::nullopt});
  };
  auto flush = [&] {
    std::vector<std::optional<Entry>> rows(queue.size());
    size_t shown = 0;  // the rows given to the listener and the report, in order
    auto finished = [&](size_t i, Entry entry) {
      if (entry.status == Status::kFailed) entry.replay = replay_command(entry, o);
      if (listener) listener(entry, true);
      rows[i] = std::move(entry);
    };
    auto show_given = [&](size_t end) {  // the rows before `end` that shared cases gave
      for (; shown < end; ++shown) {
        if (!queue[shown].given) continue;  // a check: shown as it started
        if (listener) listener(queue[shown].blank, false);
        finished(shown, *queue[shown].given);
      }
    };
    auto started = [&](size_t i) {
      show_given(i);
      if (listener) listener(queue[i].blank, false);
      shown = i + 1;
    };
    std::vector<size_t> todo;
    for (size_t i = 0; i < queue.size(); ++i) {
      if (queue[i].given) continue;
      if (o.isolate) {
        todo.push_back(i);
      } else {
        started(i);
        finished(i, queue[i].check());
      }
    }
    run_in_children(queue, todo, o, started, finished);
    show_given(queue.size());
    for (auto& row : rows) report.entries.push_back(std::move(*row));
    queue.clear();
  };
  auto wanted = [&o](const std::string& property) {
    if (o.properties.empty()) return true;
    const auto number = property.substr(0, property.find(' '));
    return std::find(o.properties.begin(), o.properties.end(), property) != o.properties.end() ||
           std::find(o.properties.begin(), o.properties.end(), number) != o.properties.end();
  };
  // The properties that can share their cases: the structural ones, and those run in each dtype.
  // At most one of a group may change the model: it reads the case last.
  std::vector<const props::GeneratedProperty*> structural, numeric;
  for (const auto& property : props::generated_properties()) {
    if (!o.share_cases || !property.shares_cases || !wanted(property.name)) continue;
    (property.numeric ? numeric : structural).push_back(&property);
  }
  for (auto* group : {&structural, &numeric}) {
    const auto changing = std::count_if(group->begin(), group->end(), [](const auto* p) {
      return p->stage == props::GeneratedProperty::Stage::kChangesModel;
    });
    if (group->size() < 2 || changing > 1) group->clear();
  }
  auto share = [&](const std::string& kind) {
    std::vector<Group> groups;
    if (!structural.empty()) groups.push_back({structural, std::nullopt});
    if (!numeric.empty()) {
      for (const auto dtype : o.dtypes) groups.push_back({numeric, dtype});
    }
    if (groups.empty()) return;
    std::vector<std::vector<std::optional<Entry>>> rows;
    if (o.isolate) {
      rows = run_shared_isolated(kind, groups, subject, translator, o);
    } else {
      for (const auto& g : groups) {
        rows.push_back(run_shared(kind, g.members, subject, translator, o, g.dtype));
      }
    }
    for (const auto& group : rows) {
      for (const auto& entry : group) {
        if (entry) shared[{entry->property, entry->target, entry->dtype}] = *entry;
      }
    }
  };
  for (const auto& kind : o.kinds) {
    shared.clear();
    share(kind);
    for (const auto& property : props::generated_properties()) {
      if (!wanted(property.name)) continue;
      if (!property.numeric) {
        run(new_entry(kind, property.name, kGenerated),
            [&] { return run_generated(kind, property, subject, translator, o, std::nullopt); });
        continue;
      }
      for (const auto dtype : o.dtypes) {
        auto blank = new_entry(kind, property.name, kGenerated);
        blank.dtype = gen::to_string(dtype);
        run(blank,
            [&, dtype] { return run_generated(kind, property, subject, translator, o, dtype); });
      }
    }
    if (wanted("P11 graph safety")) {
      run(new_entry(kind, "P11 graph safety", kDeepChain),
          [&] { return run_deep_chain(kind, subject); });
    }
    for (const auto& config : o.models) {
      if (config.numerics) {
        for (const auto dtype : o.dtypes) {
          if (!wanted("P4 backward")) break;
          auto blank = new_entry(kind, "P4 backward", config.name);
          blank.dtype = gen::to_string(dtype);
          run(blank, [&, dtype] { return run_numerics(kind, config, subject, dtype); });
        }
        for (const std::string property : {"P13 values", "P14 release"}) {
          if (!wanted(property)) continue;
          for (const auto dtype : o.dtypes) {
            auto blank = new_entry(kind, property, config.name);
            blank.dtype = gen::to_string(dtype);
            run(blank, [&, dtype, property] {
              return run_fixture_state(kind, config, subject, dtype, property);
            });
          }
        }
        continue;
      }
      for (const std::string property : kLayoutProperties) {
        if (!wanted(property)) continue;
        run(new_entry(kind, property, config.name),
            [&, property] { return run_layout(kind, config, subject, property); });
      }
    }
    flush();
  }
  // What could not run here, and why: it shows in every report.
  const auto hw = hardware::detect();
  if (hw.cuda_devices == 0) {
    auto entry = new_entry("hardware", "P1-P5, P13 on CUDA", "cuda");
    entry.status = Status::kSkipped;
    entry.reason = hw.cuda_reason;
    report.entries.push_back(entry);
  }
  if (!hw.tpu) {
    auto entry = new_entry("hardware", "real SpmdFullyShardedDataParallel (torch_xla)", "tpu");
    entry.status = Status::kSkipped;
    entry.reason = hw.tpu_reason;
    report.entries.push_back(entry);
  }
  return report;
}

std::string entry_to_json(const Entry& entry) {
  auto j = to_json_value(entry);
  j["replay"] = entry.replay;
  return j.dump();
}

Entry entry_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    auto entry = from_json_value(j);
    if (j.contains("replay")) entry.replay = j.at("replay").get<std::string>();
    return entry;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kMalformedInput, "",
                std::string("not a certification entry: ") + e.what());
  }
}

Report run(const WrapperKind& registration, Options options, const Listener& listener) {
  const ScopedRegistration scope(registration);
  // The kind and each of its modes, as `Kind[mode]`.
  options.kinds = {registration.name};
  for (const auto& mode : registration.modes) {
    if (!mode.ranks_only) options.kinds.push_back(registration.name + "[" + mode.name + "]");
  }
  return run(options, listener);
}

}  // namespace wrapcert::certify
