#pragma once
/// Certification on real PyTorch: wrapcert's generated trees are built as `torch.nn` modules by
/// a persistent Python worker, wrapped with real Python wrappers and unwrapped with a real
/// Python unwrap function; the properties are judged here, and a failing case shrinks to a small
/// tree printed as PyTorch prints it, with a standalone script that reproduces it.
///
///   wrapcert::python::Options options;
///   options.wrappers = {"torch.nn:DataParallel"};
///   options.unwrap = "mypkg.utils:unwrap_model";  // empty: wrapcert's reference, ported
///   const auto report = wrapcert::python::certify_python(options);
///   std::cout << wrapcert::certify::to_markdown(report);

#include <wrapcert/certify/certify.h>

#include <map>
#include <string>
#include <vector>

namespace wrapcert::python {

struct Options {
  /// Wrappers by import path (`package.module:callable`, found through PYTHONPATH) or by a
  /// built-in name: DataParallel, DistributedDataParallel (gloo, world size 1),
  /// checkpoint_wrapper (non-reentrant), checkpoint_wrapper[reentrant],
  /// SpmdFullyShardedDataParallel (where torch_xla imports).
  std::vector<std::string> wrappers;
  /// A wrapper's child slot, where it is not the child that is the module it was given.
  std::map<std::string, std::string> slots;
  /// The wrapcert kind (`Kind` or `Kind[mode]`) that models a wrapper, for the "C++ agreement"
  /// row: on each tree the kind's saved keys must be the real wrapper's. Torch's DataParallel,
  /// DistributedDataParallel and checkpoint_wrapper are mapped already.
  std::map<std::string, std::string> models;
  /// How a wrapper reduces its parameters' gradients across ranks ("mean" or "sum"), for P4
  /// at a world size above 1. Undeclared: a DistributedDataParallel (or subclass) averages, as
  /// its class promises; any other wrapper reduces nothing. A parameter no reducing wrapper
  /// holds keeps its rank's own gradient.
  std::map<std::string, std::string> reductions;
  /// Ranks: at N > 1 the worker runs as N torch.distributed ranks on gloo (torchrun's
  /// variables, a c10d TCPStore served here), every case on every rank, each rank on its own
  /// slice of a global batch of 2N examples.
  int world_size = 1;
  /// The unwrap function under test (`package.module:callable`, model -> module); empty: the
  /// Python port of the reference unwrap, and the wrappers are what is certified.
  std::string unwrap;
  /// Dtypes the rows that run the model (P4, P14, P17) run in, each a row of its own; every
  /// case of those rows runs in training or in eval mode, drawn. Empty: float64, float32 and
  /// bfloat16 (float16 has too few CPU kernels in PyTorch).
  std::vector<gen::Dtype> dtypes;
  int cases = 100;     ///< generated cases per property
  int max_size = 100;  ///< rapidcheck's size bound
  uint64_t seed = 0;   ///< 0: a fresh random seed (reported, for replay)
  /// P4 and P17: largest absolute difference allowed between wrapped and unwrapped outputs,
  /// gradients and (P17, per optimizer step) values; 0 means bit for bit.
  double tolerance = 0.0;
  /// The interpreter: empty means $WRAPCERT_PYTHON, else /usr/bin/python3.
  std::string interpreter;
  /// Where wrapcert_worker.py is: empty means $WRAPCERT_PYTHON_DIR, else the copy installed
  /// beside the wrapcert executable (share/wrapcert/python).
  std::string worker_dir;
  /// Seconds one case may take before the worker is stopped as hung (from the case's start:
  /// the interpreter's start has its own limit).
  double timeout_seconds = 120;
  /// Seconds a worker may take to start (the interpreter up, torch imported).
  double start_timeout_seconds = 120;
  /// What a wrapper holds besides its slot, by name (its own persistent or non-persistent
  /// buffers, parameters, modules): declared state P15 accepts and P8 does not translate.
  std::map<std::string, std::vector<std::string>> owned_state;
  /// Attributes of a wrapper that must reach the very module in its slot (P16), by name
  /// (`DistributedDataParallel.module`).
  std::map<std::string, std::vector<std::string>> aliases;
  /// A permanent unwrap (`package.module:callable`, wrapped model -> model) certified by P14:
  /// the model itself back, its own tensors, no wrapper left, the same outputs and gradients.
  /// Empty: P14 is skipped.
  std::string release;
  /// Also run the fixture rows (tiny Gemma and Mistral built in Python).
  bool fixtures = true;
  /// Where to write, for the first property that fails on a generated tree, a standalone
  /// Python script that builds the shrunk tree, wraps it, unwraps it and exits 1 showing what
  /// differs (the keys, a tensor, a gradient). Empty: none is written.
  std::string repro;
};

/// What the worker did in one run: distinct cases (a case is built, wrapped and unwrapped once
/// and judged by every property), and the time spent waiting for their replies.
struct Stats {
  int structural_cases = 0;  ///< cases without forward and backward (all properties but P4)
  double structural_seconds = 0;
  int numeric_cases = 0;  ///< P4's cases: also the model, the wrapped and the unwrapped run,
                          ///< for a batch and a single example
  double numeric_seconds = 0;
  int training_cases = 0;  ///< P17's cases: the training loop's steps and the save and load
  double training_seconds = 0;
  int fixture_cases = 0;  ///< the tiny Gemma and Mistral, built in Python (counted apart)
  double fixture_seconds = 0;
  int worker_starts = 0;      ///< processes started: one per rank, plus one per rank per fault
  int preloaded_starts = 0;   ///< of them, those a preloaded interpreter forked
  std::string torch_version;  ///< the PyTorch the worker imported
};

/// The rows of one run: a property per row, on generated trees and on the fixtures. Throws
/// `Error` when the worker cannot start or a wrapper or the subject does not import.
certify::Report certify_python(const Options& options, const certify::Listener& listener = nullptr,
                               Stats* stats = nullptr);

/// The rows a run with `options` has on generated trees, in order, each once (a row of a
/// property run in several dtypes is named once): "layout", "C++ agreement", then the property
/// table's entries certify-python runs. Starts nothing.
std::vector<std::string> row_names(const Options& options);

/// Where the worker's Python files are (see `Options::worker_dir`).
std::string worker_dir(const Options& options);

}  // namespace wrapcert::python
