#pragma once
/// The properties P1-P17 (docs/SEMANTICS.md §4) as plain functions over a spec and an unwrap
/// subject, each returning a verdict: a failed check is data, not an exception.
///
///   auto reference = wrapcert::props::subject(wrapcert::BuiltinUnwrap::kReference);
///   auto v = wrapcert::props::exact_keys(spec, reference);
///   if (!v.passed) std::cerr << v.property << ": " << v.reason << " at " << v.key << "\n";

#include <wrapcert/certify/property_table.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/gen/spec.h>
#include <wrapcert/unwrap.h>

#include <exception>
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

/// One generated case, built and observed once. The properties that read a case without
/// changing it read the same built model and the same result of the subject; each property
/// given a spec alone makes a case of its own (docs/SEMANTICS.md, "One observation per case").
///
///   props::Case c(spec, reference, /*watch=*/true);
///   auto keys = props::exact_keys(c);    // builds the model and runs the subject
///   auto same = props::identity(c);      // reads what P1 observed
///   auto left = props::non_mutation(c);  // ends the subject's result, then compares
///
/// The subject's result lives until `release`: the reference subject's `ScopedUnwrap` rewires
/// the model while it lives. Read the case in the order of `GeneratedProperty::stage`.
/// Holds references to `spec` and `u`: both must outlive it.
class Case {
 public:
  /// `watch`: before the subject first runs, keep what P5 compares (the wrapped model's tree,
  /// keys and an output); needed when P5 reads the case after another property did.
  Case(const gen::TreeSpec& spec, const UnwrapSubject& u, bool watch = false);
  ~Case();
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  const gen::TreeSpec& spec() const { return spec_; }
  const UnwrapSubject& subject() const { return u_; }
  /// The wrapped model (`gen::build(spec)`), built on first use.
  const gen::Built& built();
  /// The same model without wrappers, from the same seed: the values the model was made with.
  const gen::Built& plain();
  /// The subject's result for `built().root`, on first use.
  const Unwrapped& unwrapped();
  /// The subject's result for `plain().root`.
  const Unwrapped& plain_unwrapped();
  /// Ends what the subject's result keeps alive (a rewiring of the model); its state stays.
  void release();

  /// The wrapped model as it was before the subject first ran (P5).
  struct Before {
    std::string tree;
    std::vector<std::string> keys;
    torch::Tensor input, output;
    std::string does_not_run;  ///< why the wrapped model cannot run (the case does not apply)
  };
  /// Taken now if the subject has not run on this case yet; else what `watch` kept. Rethrows
  /// what the wrapped model threw while it was taken.
  const Before& before();

 private:
  const gen::TreeSpec& spec_;
  const UnwrapSubject& u_;
  bool watch_;
  std::unique_ptr<gen::Built> built_, plain_;
  std::optional<Before> before_;
  std::exception_ptr before_error_;
  std::string before_blame_;
  std::optional<Unwrapped> unwrapped_, plain_unwrapped_;
};

/// The properties that read a case, each as it reads one `Case` (the spec overloads below make
/// the case themselves).
Verdict exact_keys(Case& c);                        ///< P1
Verdict identity(Case& c);                          ///< P2
Verdict ties(Case& c);                              ///< P3
Verdict backward(Case& c);                          ///< P4: runs the wrapped model first
Verdict non_mutation(Case& c);                      ///< P5: ends the subject's result
Verdict laws(Case& c);                              ///< P6
Verdict legacy_agreement(Case& c);                  ///< P7
Verdict translation(Case& c, const Translator& t);  ///< P8
Verdict no_false_positives(Case& c);                ///< P9
Verdict round_trip(Case& c);                        ///< P10
Verdict graph_safety(Case& c);                      ///< P11: leaves a module in the model
Verdict order(Case& c, uint64_t shuffle_seed);      ///< P12
Verdict values(Case& c);                            ///< P13
Verdict release(Case& c);                           ///< P14: releases the model's wrappers
Verdict owned_state(Case& c);                       ///< P15
Verdict aliases(Case& c);                           ///< P16
Verdict training_loop(Case& c);                     ///< P17: trains copies of its own

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
/// P17: the model and a wrapped copy trained side by side (forward, backward, an optimizer
/// step, a no-grad call, `eval()`/`train()` through the wrappers), compared after each step;
/// then the trained model unwrapped by `u`, saved, loaded into a fresh model and run.
Verdict training_loop(const gen::TreeSpec& spec, const UnwrapSubject& u);

/// A property over generated trees as a value. Certification and the property suite loop over
/// `generated_properties()`; each property's faulty subjects are in the rejection suite.
struct GeneratedProperty {
  std::string name;    ///< "P1 keys"
  std::string checks;  ///< what it checks, in one line
  /// One case. P8 checks `translator`, P14-P16 the kinds in the tree; the others the case's
  /// subject. Runs inside a rapidcheck property (P12 draws its shuffle there).
  std::function<Verdict(Case& c, const Translator& translator)> check_case;
  /// What the property's trees need (P7: wrappers at the root only; P9: none).
  std::function<void(gen::GenOptions& options)> adjust;
  /// Runs the model (P4, P13, P14): certified in every dtype, in training and eval mode.
  bool numeric = false;
  /// Its trees hold wrappers, so each row counts the cases that held the certified kind (not
  /// P9, whose trees have none).
  bool wraps = true;
  /// Trains the model (P17): its rows say which optimizers the cases drew.
  bool trains = false;
  /// When it reads a case it shares, relative to the others: first, as it runs the wrapped
  /// model before the subject's result rewires it (P4); while that result lives; ending it
  /// (P5); after it ended; or last, as it changes the model (P11, P14). At most one property of
  /// a shared case changes the model.
  enum class Stage {
    kBeforeUnwrapped,
    kWhileUnwrapped,
    kEndsUnwrapped,
    kAfterUnwrapped,
    kChangesModel
  };
  Stage stage = Stage::kWhileUnwrapped;
  /// Its trees are drawn as the other properties' (`adjust` changes nothing): it can read the
  /// cases they read (P7 and P9 draw their own).
  bool shares_cases = true;

  /// One case of its own.
  Verdict check(const gen::TreeSpec& spec, const UnwrapSubject& u,
                const Translator& translator) const;
};

/// P1-P17 on generated trees, in order (P11 without its deep chain: see `deep_chain`).
const std::vector<GeneratedProperty>& generated_properties();

}  // namespace wrapcert::props
