#include <wrapcert/detail/blame.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/keys.h>
#include <wrapcert/printer.h>
#include <wrapcert/properties.h>

#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace wrapcert::props {
namespace {

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
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      key = got[i];
      return "key " + std::to_string(i) + " is '" + got[i] + "', expected '" + want[i] + "'";
    }
  }
  if (got.size() != want.size()) {
    key = got.size() > want.size() ? got[n] : want[n];
    return std::to_string(got.size()) + " keys, expected " + std::to_string(want.size()) +
           (got.size() > want.size() ? " (extra '" : " (missing '") + key + "')";
  }
  return {};
}

void reset_calls(const gen::Built& built) {
  for (const auto& w : built.wrappers) w->reset_calls();
}

/// Output and every original parameter's gradient (in state-dict order) of one step.
std::pair<torch::Tensor, std::vector<torch::Tensor>> step(const ModulePtr& run,
                                                          const StateDict& params,
                                                          const torch::Tensor& input) {
  for (const auto& item : params) {
    if (item.value().requires_grad()) item.value().mutable_grad() = torch::Tensor();
  }
  auto out = call(*run, input);
  if (out.requires_grad()) out.pow(2).sum().backward();  // a tree of skipped parts may have none
  std::vector<torch::Tensor> grads;
  for (const auto& item : params) {
    grads.push_back(item.value().requires_grad() && item.value().grad().defined()
                        ? item.value().grad().clone()
                        : torch::Tensor());
  }
  return {out.detach(), grads};
}

/// Bit for bit when `tolerance` is 0, else within it (relative and absolute).
bool close(const torch::Tensor& a, const torch::Tensor& b, double tolerance) {
  return tolerance == 0.0 ? a.equal(b) : torch::allclose(a, b, tolerance, tolerance);
}

bool same_grads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                double tolerance, size_t& where) {
  for (where = 0; where < a.size(); ++where) {
    if (a[where].defined() != b[where].defined()) return false;
    if (a[where].defined() && !close(a[where], b[where], tolerance)) return false;
  }
  return true;
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

UnwrapSubject subject(Subject s) {
  switch (s) {
    case Subject::kReference:
      return [](const ModulePtr& wrapped) {
        auto state = unwrap_reference(wrapped).state_dict();
        auto scope = std::make_shared<ScopedUnwrap>(wrapped);
        return Unwrapped{scope->root(), std::move(state), scope};
      };
    case Subject::kLegacy:
      return [](const ModulePtr& wrapped) {
        auto root = unwrap_legacy(wrapped);
        return Unwrapped{root, state_dict(root), nullptr};
      };
    case Subject::kDuckTyped:
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

Verdict keys(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P1 keys", [&] {
    const auto built = gen::build(spec);
    const auto got = u(built.root).state.keys();
    std::string key;
    const auto diff = key_difference(got, built.original.keys(), key);
    return diff.empty() ? pass("P1 keys") : fail("P1 keys", diff, key);
  });
}

Verdict identity(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P2 identity", [&] {
    const auto built = gen::build(spec);
    const auto state = u(built.root).state;
    for (const auto& item : built.original) {
      const auto* got = state.find(item.key());
      if (!got) return fail("P2 identity", "the tensor is missing", item.key());
      if (!got->is_same(item.value())) {
        return fail("P2 identity", "not the model's own tensor (a copy?)", item.key());
      }
    }
    return pass("P2 identity");
  });
}

Verdict ties(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P3 ties", [&] {
    const auto built = gen::build(spec);
    const auto before = tie_groups(built.original);
    const auto after = tie_groups(u(built.root).state);
    if (before == after) return pass("P3 ties");
    for (const auto& g : before) {
      if (!after.count(g)) return fail("P3 ties", "keys that shared one tensor no longer do", g[0]);
    }
    return fail("P3 ties", "keys share a tensor that did not before", after.begin()->front());
  });
}

Verdict backward(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P4 backward", [&] {
    const auto built = gen::build(spec, {c10::kDouble, 1, true});
    if (!built.bitwise) return skip("P4 backward", "a wrapper kind is not bitwise transparent");
    const auto plain = gen::build(spec, {c10::kDouble, 1, false});
    // A single example and a batch: a forward path may hide a fault behind either.
    const std::vector<torch::Tensor> inputs = {gen::sample_input(spec, c10::kDouble, 0, 1),
                                               gen::sample_input(spec, c10::kDouble, 0, 2)};
    std::vector<std::pair<torch::Tensor, std::vector<torch::Tensor>>> expected;
    for (const auto& input : inputs) expected.push_back(step(plain.root, plain.original, input));
    auto batch = [](const torch::Tensor& input) {
      return " (batch of " + std::to_string(input.size(0)) + ")";
    };
    size_t where = 0;

    for (size_t i = 0; i < inputs.size(); ++i) {
      reset_calls(built);
      const auto wrapped = step(built.root, built.original, inputs[i]);
      for (const auto& w : built.wrappers) {
        if (w->calls() == 0) {
          return fail("P4 backward",
                      "the wrapped run skipped a " + w->kind_name() + batch(inputs[i]));
        }
      }
      if (!same_grads(wrapped.second, expected[i].second, built.tolerance, where)) {
        return fail("P4 backward", "a gradient through the wrappers differs" + batch(inputs[i]),
                    built.original.keys()[where]);
      }
      if (!wrapped.first.equal(expected[i].first)) {
        return fail("P4 backward",
                    "the wrapped model's output differs from the model's" + batch(inputs[i]));
      }
    }

    const auto unwrapped = u(built.root);
    for (size_t i = 0; i < inputs.size(); ++i) {
      reset_calls(built);
      const auto run = step(unwrapped.root, built.original, inputs[i]);
      for (const auto& w : built.wrappers) {
        if (w->calls() != 0) {
          return fail("P4 backward", "the unwrapped run went through a " + w->kind_name());
        }
      }
      if (!same_grads(run.second, expected[i].second, 0.0, where)) {
        return fail("P4 backward", "a gradient of the unwrapped model differs" + batch(inputs[i]),
                    built.original.keys()[where]);
      }
      if (!run.first.equal(expected[i].first)) {
        return fail("P4 backward",
                    "the unwrapped model's output differs from the model's" + batch(inputs[i]));
      }
    }
    return pass("P4 backward");
  });
}

Verdict non_mutation(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P5 non-mutation", [&] {
    const auto built = gen::build(spec);
    const auto tree = format_tree(built.root);
    const auto keys_before = state_dict(built.root).keys();
    (void)u(built.root);  // the result, and anything it keeps alive, is gone after this line
    std::string key;
    const auto diff = key_difference(state_dict(built.root).keys(), keys_before, key);
    if (!diff.empty())
      return fail("P5 non-mutation", "the wrapped model's keys changed: " + diff, key);
    if (format_tree(built.root) != tree) {
      return fail("P5 non-mutation", "the wrapped model's tree changed");
    }
    reset_calls(built);
    (void)call(*built.root, gen::sample_input(spec, c10::kDouble));
    for (const auto& w : built.wrappers) {
      if (w->calls() == 0) {
        return fail("P5 non-mutation", "a " + w->kind_name() + " is no longer on the forward path");
      }
    }
    return pass("P5 non-mutation");
  });
}

Verdict laws(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P6 laws", [&] {
    const auto plain = gen::build(spec, {c10::kDouble, 0, false});
    const auto same = u(plain.root);
    if (same.root != plain.root) return fail("P6 laws", "u(M) is not M for an unwrapped M");
    std::string key;
    auto diff = key_difference(same.state.keys(), plain.original.keys(), key);
    if (!diff.empty()) return fail("P6 laws", "u(M) changed M's keys: " + diff, key);

    const auto built = gen::build(spec);
    const auto once = u(built.root);
    const auto twice = u(once.root);
    diff = key_difference(twice.state.keys(), once.state.keys(), key);
    return diff.empty() ? pass("P6 laws")
                        : fail("P6 laws", "u(u(x)) differs from u(x): " + diff, key);
  });
}

Verdict legacy_agreement(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P7 legacy", [&] {
    const auto built = gen::build(spec);
    const auto legacy = state_dict(unwrap_legacy(built.root)).keys();
    std::string key;
    const auto diff = key_difference(u(built.root).state.keys(), legacy, key);
    return diff.empty() ? pass("P7 legacy") : fail("P7 legacy", diff, key);
  });
}

Verdict translation(const gen::TreeSpec& spec, const Translator& t) {
  return guarded("P8 translation", [&] {
    const auto built = gen::build(spec);
    const auto wrapped = state_dict(built.root);
    if (wrapped.size() != built.original.size()) {
      return skip("P8 translation", "wrappers own state (flat parameters)");
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

Verdict no_false_positives(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P9 no false positives", [&] {
    const auto plain = gen::build(spec, {c10::kDouble, 0, false});
    std::string key;
    const auto diff = key_difference(u(plain.root).state.keys(), plain.original.keys(), key);
    return diff.empty()
               ? pass("P9 no false positives")
               : fail("P9 no false positives", "a user module was unwrapped: " + diff, key);
  });
}

Verdict round_trip(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P10 round trip", [&] {
    const auto built = gen::build(spec);
    const auto saved = u(built.root).state;
    // Through bytes, as a checkpoint file would go.
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& item : saved) dict.insert(item.key(), item.value());
    const auto bytes = torch::pickle_save(dict);
    const auto loaded = torch::pickle_load(bytes).toGenericDict();

    const auto fresh = gen::build(spec, {c10::kDouble, 99, false});  // other values
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
    const auto fresh_wrapped = gen::build(spec, {c10::kDouble, 98, true});
    if (state_dict(fresh_wrapped.root).size() == fresh_wrapped.original.size()) {
      const auto tr = KeyTranslator::from_tree(fresh_wrapped.root);
      const auto target = state_dict(fresh_wrapped.root);
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

Verdict graph_safety(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  // A chain of 10,000 wrappers of the kinds in this case (the built-in ones where it has none)
  // unwraps to the leaf. Kinds registered elsewhere in the process take no part.
  Verdict chain = guarded("P11 graph safety", [&] {
    std::vector<std::string> names;
    std::function<void(const gen::NodeSpec&)> collect = [&](const gen::NodeSpec& n) {
      for (const auto& w : n.wrappers) {
        if (std::find(names.begin(), names.end(), w) == names.end()) names.push_back(w);
      }
      for (const auto& c : n.children) collect(c.second);
    };
    collect(spec.root);
    if (names.empty()) names = Registry::with_builtins().names();
    std::vector<const WrapperKind*> kinds;
    for (const auto& name : names) kinds.push_back(&Registry::global().at(name));
    ModulePtr m = torch::nn::Linear(2, 2).ptr();
    for (int i = 0; i < 10000; ++i) m = kinds[static_cast<size_t>(i) % kinds.size()]->make(m);
    const auto got = u(m).state.keys();
    if (got != std::vector<std::string>{"weight", "bias"}) {
      return fail("P11 graph safety", "a 10,000-deep chain did not unwrap to the leaf's keys");
    }
    return pass("P11 graph safety");
  });
  if (!chain.passed) return chain;
  // A cycle: the model made its own descendant. The subject must say so, not hang or crash.
  const auto built = gen::build(spec);
  auto plain_root = unwrap_reference(built.root).root().module;
  plain_root->register_module("back_to_root", built.root);
  Verdict verdict = pass("P11 graph safety");
  try {
    (void)u(built.root);
    verdict = fail("P11 graph safety", "a cycle was not reported", "back_to_root");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCycle) {
      verdict = fail("P11 graph safety", std::string("a cycle gave another error: ") + e.what(),
                     e.key_path());
    }
  } catch (const std::exception& e) {
    verdict = fail("P11 graph safety", std::string("a cycle gave: ") + e.what());
  }
  plain_root->replace_module("back_to_root", torch::nn::Linear(1, 1).ptr());  // break the cycle
  return verdict;
}

Verdict order(const gen::TreeSpec& spec, const UnwrapSubject& u, uint64_t shuffle_seed) {
  return guarded("P12 order", [&] {
    const auto a = u(gen::build(spec).root).state.keys();
    const auto b = u(gen::build(shuffled(spec, shuffle_seed)).root).state.keys();
    std::string key;
    const auto diff = key_difference(b, a, key);
    return diff.empty() ? pass("P12 order")
                        : fail("P12 order", "another order of the same wrappers: " + diff, key);
  });
}

Verdict values(const gen::TreeSpec& spec, const UnwrapSubject& u) {
  return guarded("P13 values", [&] {
    const auto built = gen::build(spec);
    const auto expected = gen::build(spec, {c10::kDouble, 0, false}).original;  // same seed
    const auto state = u(built.root).state;
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

}  // namespace wrapcert::props
