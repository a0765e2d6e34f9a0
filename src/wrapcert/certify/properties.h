#pragma once
/// The properties P1-P16 (docs/SEMANTICS.md §4) as plain functions over a spec and an unwrap
/// subject, each returning a verdict: a failed check is data, not an exception.
///
///   auto reference = wrapcert::props::subject(wrapcert::BuiltinUnwrap::kReference);
///   auto v = wrapcert::props::exact_keys(spec, reference);
///   if (!v.passed) std::cerr << v.property << ": " << v.reason << " at " << v.key << "\n";

#include <wrapcert/gen/generators.h>
#include <wrapcert/gen/spec.h>
#include <wrapcert/unwrap.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace wrapcert::props {

/// What a subject gives back: the state it would save, and a module to run (and to unwrap
/// again). `keep_alive` holds whatever must live while `root` runs (a `ScopedUnwrap`).
struct Unwrapped {
  ModulePtr root;
  StateDict state;
  std::shared_ptr<void> keep_alive;
};
using UnwrapSubject = std::function<Unwrapped(const ModulePtr& wrapped)>;

/// The library's subjects. The reference one runs its result under a `ScopedUnwrap`.
UnwrapSubject subject(BuiltinUnwrap s);

/// Given a wrapped model, a function from its wrapped keys to clean keys.
using Translator = std::function<std::function<std::string(const std::string&)>(const ModulePtr&)>;
/// `KeyTranslator::from_tree(...).to_clean`.
Translator reference_translator();

struct Verdict {
  std::string property;  ///< "P1 keys"
  bool passed = true;
  bool skipped = false;  ///< the case does not apply (P4 on non-bitwise wrappers)
  std::string reason;
  std::string key;  ///< the offending key or path, when there is one
};

/// Where two ordered key lists first differ: the position, the keys there on each side ("" past
/// an end) and the lengths. What P1, the fixtures' layouts and the Python rows report.
struct KeyDifference {
  size_t index = 0;
  std::string got, want;
  size_t got_size = 0, want_size = 0;
  /// The offending key: the differing or extra key found, else the expected one missing.
  const std::string& key() const { return got.empty() ? want : got; }
  /// "key 3 is 'a', expected 'b'", "5 keys, expected 4 (extra 'x')".
  std::string describe() const;
};
/// The first difference between `got` and `want` (names, order, length), if any.
std::optional<KeyDifference> first_key_difference(const std::vector<std::string>& got,
                                                  const std::vector<std::string>& want);

/// The gradient of each of `params` (the model's own tensors) after a backward through `root`,
/// cloned: its own `.grad`, plus, for a parameter a wrapper in `root` holds flat, the part of
/// that wrapper's flat gradient where it lies (the wrapper's declared state shares the
/// parameter's storage, as FSDP's flat parameter does and `FlatParameters` arranges). Undefined
/// where no gradient reached it: a forward on detached views leaves the flat gradient empty.
std::vector<torch::Tensor> model_gradients(const ModulePtr& root, const StateDict& params);

/// One step: the output (detached) and `model_gradients`.
using Step = std::pair<torch::Tensor, std::vector<torch::Tensor>>;
/// Clears the gradients of `params` and of `run`'s parameters, runs `run` on `input` and
/// differentiates the sum of its squared outputs. An exception in backward is blamed on `who`.
Step step(const ModulePtr& run, const StateDict& params, const torch::Tensor& input,
          const char* who = "the model");
/// Both undefined, or the same dtype and shape and equal: bit for bit when `tolerance` is 0,
/// else within it (relative and absolute).
bool close(const torch::Tensor& a, const torch::Tensor& b, double tolerance);
/// Whether two gradient lists agree (`close`, and defined alike); `where` is the first index
/// where they do not. `order_tolerance` (0: none) also accepts gradients within that fraction
/// of the larger of 1 and the expected gradient's largest magnitude: sums of the same
/// contributions added in another order (shared modules, tied weights).
bool same_grads(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                double tolerance, size_t& where, double order_tolerance = 0.0);

/// Keys grouped by the tensor they share: every group of two or more keys (what P3 compares).
std::set<std::vector<std::string>> tie_groups(const StateDict& state);

Verdict exact_keys(const gen::TreeSpec& spec, const UnwrapSubject& u);          ///< P1
Verdict identity(const gen::TreeSpec& spec, const UnwrapSubject& u);            ///< P2
Verdict ties(const gen::TreeSpec& spec, const UnwrapSubject& u);                ///< P3
Verdict backward(const gen::TreeSpec& spec, const UnwrapSubject& u);            ///< P4
Verdict non_mutation(const gen::TreeSpec& spec, const UnwrapSubject& u);        ///< P5
Verdict laws(const gen::TreeSpec& spec, const UnwrapSubject& u);                ///< P6
Verdict legacy_agreement(const gen::TreeSpec& spec, const UnwrapSubject& u);    ///< P7
Verdict translation(const gen::TreeSpec& spec, const Translator& t);            ///< P8
Verdict no_false_positives(const gen::TreeSpec& spec, const UnwrapSubject& u);  ///< P9
Verdict round_trip(const gen::TreeSpec& spec, const UnwrapSubject& u);          ///< P10
/// P11 on a tree: a cycle (the model made its own descendant) is an `Error` (kCycle), not a
/// hang or a crash.
Verdict graph_safety(const gen::TreeSpec& spec, const UnwrapSubject& u);
/// P11 in depth: a chain of `depth` wrappers of `kinds` in turn (`Kind` or `Kind[mode]`) around
/// a `Linear` unwraps to the leaf's keys. Built in time linear in `depth`; run once per kind, not
/// per generated case.
Verdict deep_chain(const std::vector<std::string>& kinds, const UnwrapSubject& u,
                   int depth = 10000);
/// P12: every stack shuffled by `shuffle_seed` and its innermost kind repeated.
Verdict order(const gen::TreeSpec& spec, const UnwrapSubject& u, uint64_t shuffle_seed);
Verdict values(const gen::TreeSpec& spec, const UnwrapSubject& u);  ///< P13

/// The contracts a kind declares, checked on the kinds in the spec rather than on a subject.
/// P14: `release_wrappers` (each kind's `release`) gives back the model itself: every tensor
/// the original, keys, order, ties and values as built, the same outputs and gradients, no
/// wrapper on a path; each wrapper still holds what its release returned, and still unwraps to
/// the model's keys.
Verdict release(const gen::TreeSpec& spec);
/// P15: a wrapper holds nothing besides its slot that its kind does not declare in
/// `owned_state`, and what it declares is none of the model's modules or tensors.
Verdict owned_state(const gen::TreeSpec& spec);
/// P16: every alias a kind declares reaches the very module in the wrapper's slot.
Verdict aliases(const gen::TreeSpec& spec);

/// A property over generated trees as a value. Certification and the property suite loop over
/// `generated_properties()`; each property's faulty subjects are in the rejection suite.
struct GeneratedProperty {
  std::string name;    ///< "P1 keys"
  std::string checks;  ///< what it checks, in one line
  /// One case. P8 checks `translator`, P14-P16 the kinds in the tree; the others `u`. Runs
  /// inside a rapidcheck property (P12 draws its shuffle there).
  std::function<Verdict(const gen::TreeSpec& spec, const UnwrapSubject& u,
                        const Translator& translator)>
      check;
  /// What the property's trees need (P7: wrappers at the root only; P9: none).
  std::function<void(gen::GenOptions& options)> adjust;
  /// Runs the model (P4, P13, P14): certified in every dtype, in training and eval mode.
  bool numeric = false;
  /// Its trees hold wrappers, so each row counts the cases that held the certified kind (not
  /// P9, whose trees have none).
  bool wraps = true;
};

/// P1-P16 on generated trees, in order (P11 without its deep chain: see `deep_chain`).
const std::vector<GeneratedProperty>& generated_properties();

}  // namespace wrapcert::props
