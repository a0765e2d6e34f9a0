#pragma once
/// Certification of wrapper kinds against P1-P17, for authors of new wrappers.
///
///   auto report = wrapcert::certify::run(
///       wrapcert::wrapper_kind<MyShardImpl>("MyShard", "_sharded"));
///   std::cout << wrapcert::certify::to_markdown(report);
///   return report.passed() ? 0 : 1;
///
/// A failed check is an entry in the report (with its shrunk counterexample), never an
/// exception; misuse (an unknown kind, a bad option) is an `Error`. Whole models (the built-in
/// fixtures: `wrapcert::fixtures::certification_models()`) are certified when `Options::models`
/// lists them; without, the generated trees alone.

#include <wrapcert/certify/properties.h>
#include <wrapcert/registry.h>
#include <wrapcert/unwrap.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace wrapcert::certify {

/// A whole model to certify the kinds on: every module whose class is in `wrap_classes` is
/// wrapped in the kind, then the root, and the subject must give the model back.
struct Model {
  std::string name;  ///< what reports call it (`gemma-2b`)
  /// A fresh model on `device` in `dtype`: the same values on every call.
  std::function<ModulePtr(c10::Device device, c10::ScalarType dtype)> build;
  /// The classes wrapped one by one (a model's `_no_split_modules`), by their Python name.
  std::vector<std::string> wrap_classes;
  /// true: P4, forward and backward in double on the CPU (a tiny model). false: P1-P3 on the
  /// meta device in `dtype` (a full-size layout, no weight memory).
  bool numerics = false;
  c10::ScalarType dtype = c10::kFloat;
};

struct Options {
  /// Wrapper kinds to certify, by registered name; empty means every kind in the registry.
  std::vector<std::string> kinds;
  /// Properties to run, by name ("P4 backward") or number ("P4"); empty means all.
  std::vector<std::string> properties;
  /// Whole models to run on besides the generated trees: full-size layouts (on meta) for P1-P3,
  /// tiny ones for P4. Empty: the generated trees alone.
  std::vector<Model> models;
  BuiltinUnwrap subject = BuiltinUnwrap::kReference;
  /// An unwrap function of your own, certified in place of `subject` when set: the kinds wrap
  /// the generated trees and the fixtures, and it must give the model back.
  props::UnwrapSubject custom_subject;
  /// What reports call `custom_subject`.
  std::string custom_subject_name = "custom";
  /// A key translator of your own for P8, in place of the reference one.
  props::Translator custom_translator;
  /// What reports call `custom_translator`.
  std::string custom_translator_name = "custom";
  /// The plugin libraries the kinds come from (`wrapcert certify --plugin`): replay lines load
  /// them. A kind neither built in nor from a plugin is replayed through the API.
  std::vector<std::string> plugins;
  /// Dtypes P4, P13 and P14 run in, each a row of its own (on generated trees and tiny fixtures);
  /// every case of those rows runs in training or in eval mode, drawn. Empty: every dtype.
  std::vector<gen::Dtype> dtypes;
  int cases = 100;     ///< generated cases per property and kind
  int max_size = 100;  ///< rapidcheck's size bound
  uint64_t seed = 0;   ///< 0: a fresh random seed (reported, for replay)
  /// Run the checks in child processes, so that a crash, an abort or a hang in the code under
  /// certification becomes a failed entry (naming the signal or the limit) instead of ending the
  /// run and losing the report. A child runs a kind's checks one after another while they pass;
  /// a check that fails after others ran in its child runs again in a child of its own, which
  /// gives its row.
  bool isolate = true;
  /// Seconds one check may take in its child process before it is stopped as hung; the report
  /// names the case that was running then.
  int timeout_seconds = 120;
  /// Run the properties that draw the same trees together, each case built and observed once
  /// (`props::Case`): the structural ones, and P4, P13 and P14 in each dtype. Every property
  /// still gets its own row, cases and coverage; one that fails, skips a case or is not
  /// exercised there (or whose group crashes or hangs) is run again alone, so its verdict,
  /// shrunk counterexample and replay line are those of a run of its own. False: each alone.
  bool share_cases = true;
};

struct Entry;
/// Called before (`done` false) and after (`done` true) each check, for progress output.
using Listener = std::function<void(const Entry& entry, bool done)>;

enum class Status { kPassed, kFailed, kSkipped };
const char* to_string(Status status);

/// What the cases that exercised a row on generated trees drew: the dimensions training varies.
/// Empty for other rows. The reports' "exercised" section of each kind gathers its rows'.
struct Drawn {
  std::vector<int64_t> widths, batches;  ///< each value once, ascending
  int training = 0, eval = 0;            ///< cases in each mode
  int frozen = 0;                        ///< cases with frozen parameters
  int mode_leaves = 0;                   ///< cases with a leaf that computes by mode
  int cloneable = 0;                     ///< cases with LibTorch's cloneable `Linear`
  int sgd = 0, adam = 0;                 ///< cases trained with each optimizer (P17 rows)
  /// Across N ranks: cases whose width (the rows a first-dimension sharding splits) divides
  /// evenly, does not, or is below N (some rank holds no row).
  int even_rows = 0, uneven_rows = 0, empty_rows = 0;
  bool empty() const { return training + eval == 0; }
};

struct Entry {
  std::string kind;      ///< the wrapper kind certified
  std::string property;  ///< "P1 keys"
  std::string target;    ///< "generated trees" or a fixture name
  std::string dtype;     ///< what P4, P13 and P14 ran in (`float32`); empty for the others
  Status status = Status::kPassed;
  std::string reason;          ///< why it failed or was skipped
  std::string key;             ///< the offending key, when there is one
  std::string counterexample;  ///< the shrunk tree with its keys
  int cases = 0;               ///< cases run
  /// Cases that ran the check on a model holding the certified kind (or mode); -1 where the
  /// property does not wrap (P9). A row that wraps and never ran the kind is a failure.
  int exercised = -1;
  /// How the exercised cases ran (`12 in training mode, 9 in eval mode`).
  std::string coverage;
  /// What the exercised cases drew (generated trees).
  Drawn drawn;
  double seconds = 0.0;
  std::string replay;  ///< for a failure: the command that runs this check again
};

struct Report {
  Options options;  ///< with the seed actually used
  std::vector<Entry> entries;
  bool passed() const;
  size_t count(Status status) const;
};

/// Runs every property for each kind on generated trees (the kind mixed with the built-in
/// kinds) and on `models`, the checks in child processes unless `isolate` is off.
/// Throws `Error` for an unknown kind or a bad option.
Report run(const Options& options, const Listener& listener = nullptr);
/// Certifies `registration`, registered for this run alone (unless a kind of its name is
/// registered already): the global registry is as it was when the call returns, so no
/// certification depends on what ran before it.
Report run(const WrapperKind& registration, Options options = {},
           const Listener& listener = nullptr);

/// The subject's name in reports: `custom_subject_name`, or the built-in subject's.
std::string subject_name(const Options& options);

/// `target`, with the dtype when there is one: `generated trees (float32)`.
std::string target_label(const Entry& entry);

/// One compact table: a row per property and target, a column per kind (pass, FAIL, skip) with
/// the number of cases that exercised the kind.
std::string to_summary(const Report& report);
/// A table per kind: property, target, result, reason.
std::string to_markdown(const Report& report);
/// With a `context` block: wrapcert and LibTorch versions, seed, options.
std::string to_json(const Report& report);
/// One testsuite per kind, one testcase per entry; failures carry the counterexample.
std::string to_junit(const Report& report);

/// Adds a case that held the certified kind to what a row drew (`trains`: the row trains, and
/// counts the case's optimizer); across `world_size` ranks, also how its width splits.
void add_drawn(Drawn& drawn, const gen::TreeSpec& spec, bool trains, int64_t world_size = 1);
/// Sets a row's `drawn`, `exercised` and coverage line from what its cases drew: how many held
/// `kind`, by mode where `by_mode`, and the optimizers where `trains`.
void set_coverage(Entry& entry, const std::string& kind, const Drawn& drawn, bool by_mode,
                  bool trains);

/// The "exercised" section of `kind` in one paragraph: the dtypes, widths, batch sizes, modes,
/// frozen parameters and leaves its rows' cases drew, the training loop's steps, the world
/// sizes; a dimension none of them drew says so.
std::string exercised_text(const Report& report, const std::string& kind);

/// One entry as a JSON object, and back (how entries travel between processes).
std::string entry_to_json(const Entry& entry);
/// Throws `Error` (kMalformedInput) for text that is not an entry.
Entry entry_from_json(const std::string& text);

}  // namespace wrapcert::certify
