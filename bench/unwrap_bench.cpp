// How fast unwrap, translation and checking are, and how cost grows, beside the floor LibTorch
// itself sets (a `named_modules()` walk and `named_parameters()` key extraction).
//   build/bench/wrapcert_bench --benchmark_out=run.json --benchmark_out_format=json
//       --benchmark_repetitions=9
// tools/bench_report.py turns runs into Markdown and a plot; tools/bench_compare.py gates;
// scripts/bench.sh does all of it.

#include "bench_paths.h"

#include <wrapcert/certify/certify.h>
#include <wrapcert/certify/launch.h>
#include <wrapcert/certify/properties.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/fixtures/certification.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/process_group.h>
#include <wrapcert/python/certify_python.h>
#include <wrapcert/test_support/memory.h>
#include <wrapcert/test_support/trees.h>
#include <wrapcert/wrapcert.h>

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <rapidcheck/Random.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>

#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

using wrapcert::BuiltinUnwrap;
using wrapcert::ModulePtr;

/// A custom parent that calls its children by name.
struct NodeImpl : wrapcert::Layer {
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
};

/// About `n` modules: nodes with 4 children, every 8th a Linear leaf, every 4th wrapped.
ModulePtr synthetic_tree(int64_t n) {
  auto root = std::make_shared<NodeImpl>();
  std::vector<ModulePtr> frontier{root};
  int64_t count = 1;
  const auto& kinds = wrapcert::Registry::global().kinds();
  for (size_t i = 0; count < n && i < frontier.size(); ++i) {
    const auto parent = frontier[i];  // a copy: push_back below may reallocate
    for (int c = 0; c < 4 && count < n; ++c, ++count) {
      const bool leaf = count % 8 == 0;
      ModulePtr child =
          leaf ? ModulePtr(torch::nn::Linear(1, 1).ptr()) : ModulePtr(std::make_shared<NodeImpl>());
      if (!leaf) frontier.push_back(child);
      if (count % 4 == 0) child = kinds[static_cast<size_t>(count) % kinds.size()].make(child);
      parent->register_module(std::to_string(c), child);
    }
  }
  return root;
}

ModulePtr chain(int64_t depth) {
  ModulePtr m = torch::nn::Linear(1, 1).ptr();
  const auto& kinds = wrapcert::Registry::global().kinds();
  for (int64_t i = 0; i < depth; ++i) m = kinds[static_cast<size_t>(i) % kinds.size()].make(m);
  return m;
}

const wrapcert::fixtures::CausalLMConfig& layout(int64_t index) {
  static const auto configs = std::vector<wrapcert::fixtures::CausalLMConfig>{
      wrapcert::fixtures::gemma_2b(), wrapcert::fixtures::mistral_7b()};
  return configs.at(static_cast<size_t>(index));
}

/// The seed's FSDPv2 recipe on a full-size fixture on meta.
ModulePtr seed_wrapped(int64_t index) {
  const auto& config = layout(index);
  return wrapcert::fixtures::apply_fsdp_v2_recipe(
      wrapcert::fixtures::make_causal_lm(config, {c10::kMeta, config.checkpoint_dtype}), config);
}

/// Bytes the C++ heap holds now (glibc's count: exact, unlike RSS, which reuse hides).
double heap_mb() {
  const auto info = ::mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd) / (1024.0 * 1024.0);
}

/// `n` modules (rounded to whole blocks of 998 leaves): the adversarial test's million-module
/// tree at other sizes.
ModulePtr wide_tree(int64_t n) {
  constexpr int64_t kWidth = 998;
  return wrapcert::test_support::wide_tree(std::max<int64_t>(1, n / (kWidth + 2)), kWidth);
}

// ---- the floor --------------------------------------------------------------------------

void BM_NamedModulesWalk(benchmark::State& state) {
  auto tree = synthetic_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(tree->named_modules());
  state.SetComplexityN(state.range(0));
}

void BM_NamedParametersKeys(benchmark::State& state) {
  auto tree = synthetic_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(tree->named_parameters().keys());
  state.SetComplexityN(state.range(0));
}

// ---- unwrap on synthetic trees ----------------------------------------------------------

void BM_UnwrapReference(benchmark::State& state) {
  auto tree = synthetic_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_reference(tree));
  state.SetComplexityN(state.range(0));
}

void BM_UnwrapLegacy(benchmark::State& state) {
  auto tree = synthetic_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap(BuiltinUnwrap::kLegacy, tree));
  state.SetComplexityN(state.range(0));
}

void BM_UnwrapDuckTyped(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    auto tree = synthetic_tree(state.range(0));  // it rewires what it is given
    state.ResumeTiming();
    benchmark::DoNotOptimize(wrapcert::unwrap_duck_typed(tree));
  }
  state.SetComplexityN(state.range(0));
}

// ---- wrapper chains ---------------------------------------------------------------------

void BM_UnwrapReferenceChain(benchmark::State& state) {
  auto m = chain(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_reference(m));
  state.SetComplexityN(state.range(0));
  wrapcert::release_tree(std::move(m));  // LibTorch's destructors would recurse per level
}

void BM_UnwrapLegacyChain(benchmark::State& state) {
  auto m = chain(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_legacy(m));
  state.SetComplexityN(state.range(0));
  wrapcert::release_tree(std::move(m));
}

void BM_TranslatorChain(benchmark::State& state) {
  auto m = chain(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::KeyTranslator::from_tree(m));
  state.SetComplexityN(state.range(0));
  wrapcert::release_tree(std::move(m));
}

// ---- very large trees: time and memory ---------------------------------------------------

/// Building the tree (LibTorch's part: modules, names, meta parameters), with the memory the
/// tree itself takes.
void BM_WideTreeBuild(benchmark::State& state) {
  double tree_mb = 0;
  for (auto _ : state) {
    const double before = heap_mb();
    auto tree = wide_tree(state.range(0));
    tree_mb = heap_mb() - before;
    state.PauseTiming();
    wrapcert::release_tree(std::move(tree));
    state.ResumeTiming();
  }
  state.counters["tree_mb"] = tree_mb;
  state.counters["bytes_per_module"] = tree_mb * 1024 * 1024 / static_cast<double>(state.range(0));
  state.SetComplexityN(state.range(0));
}

/// The reference unwrap of the tree, with the memory its view adds on top of the tree.
void BM_WideTreeUnwrap(benchmark::State& state) {
  auto tree = wide_tree(state.range(0));
  double view_mb = 0;
  for (auto _ : state) {
    const double before = heap_mb();
    auto view = wrapcert::unwrap_reference(tree);
    view_mb = std::max(view_mb, heap_mb() - before);
    benchmark::DoNotOptimize(view);
  }
  state.counters["view_mb"] = view_mb;
  state.SetComplexityN(state.range(0));
  wrapcert::release_tree(std::move(tree));
}

/// Every key of the tree, wrapped and clean, indexed both ways.
void BM_WideTreeTranslator(benchmark::State& state) {
  auto tree = wide_tree(state.range(0));
  double translator_mb = 0;
  for (auto _ : state) {
    const double before = heap_mb();
    auto tr = wrapcert::KeyTranslator::from_tree(tree);
    translator_mb = std::max(translator_mb, heap_mb() - before);
    benchmark::DoNotOptimize(tr);
  }
  state.counters["translator_mb"] = translator_mb;
  state.counters["peak_rss_mb"] = wrapcert::test_support::peak_rss_mib();
  state.SetComplexityN(state.range(0));
  wrapcert::release_tree(std::move(tree));
}

// ---- full-size layouts under the seed's recipe -----------------------------------------

void BM_NamedModulesWalkLayout(benchmark::State& state) {
  auto model = seed_wrapped(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(model->named_modules());
  state.SetLabel(layout(state.range(0)).name);
}

void BM_UnwrapReferenceLayout(benchmark::State& state) {
  auto model = seed_wrapped(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_reference(model));
  state.SetLabel(layout(state.range(0)).name);
}

void BM_UnwrapLegacyLayout(benchmark::State& state) {
  auto model = seed_wrapped(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap(BuiltinUnwrap::kLegacy, model));
  state.SetLabel(layout(state.range(0)).name);
}

void BM_UnwrapDuckTypedLayout(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    auto model = seed_wrapped(state.range(0));
    state.ResumeTiming();
    benchmark::DoNotOptimize(wrapcert::unwrap_duck_typed(model));
  }
  state.SetLabel(layout(state.range(0)).name);
}

void BM_NamedParametersLayout(benchmark::State& state) {
  // LibTorch's own listing of the wrapped layout's parameters: the floor for a state dict.
  auto model = seed_wrapped(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(model->named_parameters());
  state.SetLabel(layout(state.range(0)).name);
}

void BM_StateDictViewLayout(benchmark::State& state) {
  auto model = seed_wrapped(state.range(0));
  const auto view = wrapcert::unwrap_reference(model);
  for (auto _ : state) benchmark::DoNotOptimize(view.state_dict());
  state.SetLabel(layout(state.range(0)).name);
}

void BM_BuildLayoutOnMeta(benchmark::State& state) {
  const auto& config = layout(state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        wrapcert::fixtures::make_causal_lm(config, {c10::kMeta, config.checkpoint_dtype}));
  }
  state.counters["peak_rss_mb"] = wrapcert::test_support::peak_rss_mib();
  state.SetLabel(config.name);
}

void BM_TranslateKeys(benchmark::State& state) {
  auto model = seed_wrapped(state.range(0));
  const auto tr = wrapcert::KeyTranslator::from_tree(model);
  std::vector<std::string> keys;
  for (const auto& [w, c] : tr.pairs()) keys.push_back(w);
  for (auto _ : state) {
    for (const auto& k : keys) benchmark::DoNotOptimize(tr.to_clean(k));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(keys.size()));
  state.SetLabel(layout(state.range(0)).name);
}

// ---- property throughput ----------------------------------------------------------------

/// 64 specs drawn from the property suite's generator (fixed seed, size 50): every dtype, or
/// the one P4 is certified in as a row of its own (training and eval mode drawn, as certify
/// draws them).
std::vector<wrapcert::gen::TreeSpec> draw_specs(std::optional<wrapcert::gen::Dtype> dtype) {
  wrapcert::gen::GenOptions options;
  if (dtype) {
    options.dtypes = {*dtype};
    options.eval_mode = true;
  }
  std::vector<wrapcert::gen::TreeSpec> out;
  rc::Random random(42);
  const auto trees = wrapcert::gen::trees(options);
  for (int i = 0; i < 64; ++i) out.push_back(trees(random.split(), 50).value());
  return out;
}

const std::vector<wrapcert::gen::TreeSpec>& sample_specs() {
  static const auto specs = draw_specs(std::nullopt);
  return specs;
}

template <typename Check>
void run_property(benchmark::State& state, Check check,
                  const std::vector<wrapcert::gen::TreeSpec>& specs = sample_specs()) {
  const auto reference = wrapcert::props::subject(BuiltinUnwrap::kReference);
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(check(specs[i++ % specs.size()], reference));
  state.SetItemsProcessed(state.iterations());  // cases
}

void BM_PropertyStructural(benchmark::State& state) {
  // P1, P2, P3, P5, P6, P9 and P12 on one case, built and observed once (`props::Case`), in
  // the order certification reads a shared case: the structural properties.
  run_property(state, [](const auto& spec, const auto& u) {
    namespace props = wrapcert::props;
    props::Case c(spec, u, /*watch=*/true);
    return props::exact_keys(c).passed && props::identity(c).passed && props::ties(c).passed &&
           props::laws(c).passed && props::no_false_positives(c).passed &&
           props::order(c, 1).passed && props::non_mutation(c).passed;
  });
}

void BM_PropertyStructuralAlone(benchmark::State& state) {
  // The same properties, each on a case of its own (as `--properties P1` runs one).
  run_property(state, [](const auto& spec, const auto& u) {
    namespace props = wrapcert::props;
    return props::exact_keys(spec, u).passed && props::identity(spec, u).passed &&
           props::ties(spec, u).passed && props::non_mutation(spec, u).passed &&
           props::laws(spec, u).passed && props::no_false_positives(spec, u).passed &&
           props::order(spec, u, 1).passed;
  });
}

void BM_PropertyBackward(benchmark::State& state) {
  // P4 on cases of one dtype, as certification runs it: a row per dtype.
  const auto dtype = wrapcert::gen::kAllDtypes[state.range(0)];
  state.SetLabel(wrapcert::gen::to_string(dtype));
  const auto specs = draw_specs(dtype);
  run_property(
      state,
      [](const auto& spec, const auto& u) { return wrapcert::props::backward(spec, u).passed; },
      specs);
}

void BM_PropertyTraining(benchmark::State& state) {
  // P17 on cases of one dtype, as certification runs it: two models trained side by side for
  // six steps, then saved and loaded.
  const auto dtype = wrapcert::gen::kAllDtypes[state.range(0)];
  state.SetLabel(wrapcert::gen::to_string(dtype));
  const auto specs = draw_specs(dtype);
  run_property(
      state,
      [](const auto& spec, const auto& u) {
        return wrapcert::props::training_loop(spec, u).passed;
      },
      specs);
}

/// A kind whose `make` walks all of the module it wraps (as a cast or a device move in place
/// does): building a deep chain of it by nesting is quadratic, which certification must not be.
class WalkingRelayImpl final : public wrapcert::WrapperImpl {
 public:
  explicit WalkingRelayImpl(wrapcert::ModulePtr inner)
      : WrapperImpl("WalkingRelay", "_walked_module", walk(std::move(inner))) {}

 private:
  static wrapcert::ModulePtr walk(wrapcert::ModulePtr inner) {
    for (const auto& m : inner->modules()) benchmark::DoNotOptimize(m.get());
    return inner;
  }
};

/// Cases per property of the certification benchmarks: 100 (the default of `wrapcert certify`
/// and `certify-python`) unless `--wrapcert_certify_cases=N` says otherwise (the smoke test's
/// few, which run each benchmark's code without timing a full certification).
int g_certify_cases = 100;

/// Kinds certified by BM_CertifyOneKind, by argument: a pass-through, recomputation, the flat-
/// parameter mode, and a kind whose `make` walks the module it wraps.
const char* const kCertifiedKinds[] = {"DataParallel", "CheckpointWrapper",
                                       "FullyShardedDataParallel[flat]", "WalkingRelay"};

void BM_CertifyOneKind(benchmark::State& state) {
  // `wrapcert certify --wrappers KIND` with default options: 100 cases per property, every
  // fixture, each check in a child process. Wall time: the work is in the children.
  const std::string kind = kCertifiedKinds[state.range(0)];
  state.SetLabel(kind);
  wrapcert::certify::Options options;
  options.seed = 1;
  options.cases = g_certify_cases;
  options.models = wrapcert::fixtures::certification_models();
  for (auto _ : state) {
    wrapcert::certify::Report report;
    if (kind == "WalkingRelay") {
      report = wrapcert::certify::run(
          wrapcert::wrapper_kind<WalkingRelayImpl>("WalkingRelay", "_walked_module"), options);
    } else {
      options.kinds = {kind};
      report = wrapcert::certify::run(options);
    }
    for (const auto& e : report.entries) {
      if (e.status == wrapcert::certify::Status::kFailed) {
        state.SkipWithError(
            (kind + ": " + e.property + " [" + e.target + "] failed: " + e.reason).c_str());
        break;
      }
    }
  }
}

/// Wrappers certified on real PyTorch by BM_CertifyPython, by argument.
const char* const kPythonWrappers[] = {"DataParallel", "checkpoint_wrapper",
                                       "DistributedDataParallel"};

void BM_CertifyPython(benchmark::State& state) {
  // `wrapcert certify-python --wrapper W --cases 100 --dtypes float64` on generated trees (no
  // fixture rows): cases per second through the worker, for the structural properties, for P4
  // and for the training loop (P17). Float64 alone: torch 1.13's gloo has no bfloat16, so
  // DistributedDataParallel refuses such models.
  const std::string wrapper = kPythonWrappers[state.range(0)];
  state.SetLabel(wrapper);
  wrapcert::python::Options options;
  options.wrappers = {wrapper};
  options.dtypes = {wrapcert::gen::Dtype::kFloat64};
  options.seed = 1;
  options.cases = g_certify_cases;
  options.fixtures = false;
  wrapcert::python::Stats stats;
  for (auto _ : state) {
    const auto report = wrapcert::python::certify_python(options, nullptr, &stats);
    if (!report.passed()) state.SkipWithError((wrapper + " did not pass").c_str());
  }
  state.counters["structural_cases_per_s"] = stats.structural_cases / stats.structural_seconds;
  state.counters["p4_cases_per_s"] = stats.numeric_cases / stats.numeric_seconds;
  state.counters["p17_cases_per_s"] = stats.training_cases / stats.training_seconds;
  state.counters["cases"] = stats.structural_cases + stats.numeric_cases + stats.training_cases;
}

void BM_CertifyPythonAcrossRanks(benchmark::State& state) {
  // `wrapcert certify-python --wrapper DistributedDataParallel --world-size N --cases 100` on
  // generated trees: each case on every rank, DDP's all-reduce real from world size 2.
  wrapcert::python::Options options;
  options.wrappers = {"DistributedDataParallel"};
  options.world_size = static_cast<int>(state.range(0));
  options.dtypes = {wrapcert::gen::Dtype::kFloat64};
  options.seed = 1;
  options.cases = g_certify_cases;
  options.fixtures = false;
  wrapcert::python::Stats stats;
  for (auto _ : state) {
    const auto report = wrapcert::python::certify_python(options, nullptr, &stats);
    if (!report.passed()) state.SkipWithError("DistributedDataParallel did not pass");
  }
  state.counters["structural_cases_per_s"] = stats.structural_cases / stats.structural_seconds;
  state.counters["p4_cases_per_s"] = stats.numeric_cases / stats.numeric_seconds;
  state.counters["processes"] = stats.worker_starts;
}

/// Kinds certified across ranks by BM_CertifyAcrossRanks, by argument.
const char* const kRankKinds[] = {"FullyShardedDataParallel[sharded]", "DistributedDataParallel"};

/// This program, as a rank of BM_CertifyAcrossRanks (`--rank-run KIND CASES`): default options
/// but the cases.
int run_as_rank(const std::string& kind) {
  wrapcert::certify::Options options;
  options.seed = 1;
  options.cases = g_certify_cases;
  options.kinds = {kind};
  const auto report =
      wrapcert::certify::run_rank(options, *wrapcert::Rendezvous::from_env(), nullptr);
  return report.passed() ? 0 : 1;
}

void BM_CertifyAcrossRanks(benchmark::State& state) {
  // `wrapcert certify --world-size N --wrappers KIND` with default options (100 cases per
  // property, P4 in four dtypes, P17 in float64 and float32): wall time, ranks started and
  // watched by the launcher. P4's and P17's cases per second per dtype, from rank 0's entries.
  const std::string kind = kRankKinds[state.range(0)];
  const int world = static_cast<int>(state.range(1));
  state.SetLabel(kind);
  wrapcert::certify::World w;
  w.size = world;
  w.command = {std::filesystem::read_symlink("/proc/self/exe").string(), "--rank-run", kind,
               std::to_string(g_certify_cases)};
  wrapcert::certify::Options options;
  options.seed = 1;
  options.cases = g_certify_cases;
  options.kinds = {kind};
  wrapcert::certify::Report report;
  for (auto _ : state) {
    report = wrapcert::certify::launch_ranks(options, w);
    if (!report.passed()) {
      for (const auto& e : report.entries) {
        if (e.status == wrapcert::certify::Status::kFailed) {
          state.SkipWithError((kind + ": " + e.property + " failed: " + e.reason).c_str());
          break;
        }
      }
    }
  }
  for (const auto& e : report.entries) {
    if (e.property.rfind("P4 ", 0) == 0 && e.seconds > 0) {
      state.counters["p4_" + e.dtype + "_cases_per_s"] = e.cases / e.seconds;
    }
    if (e.property.rfind("P17 ", 0) == 0 && e.seconds > 0) {
      state.counters["p17_" + e.dtype + "_cases_per_s"] = e.cases / e.seconds;
    }
  }
}

void BM_CollectiveRoundTrip(benchmark::State& state) {
  // One all-gather of a short text between two ranks over Gloo on the loopback (what each case
  // of a certification across ranks does a few times): this process is rank 0, a forked child
  // rank 1, meeting at a TCPStore this process serves.
  constexpr int kTrips = 200;
  wrapcert::StoreServer store(0);
  wrapcert::Rendezvous r;
  r.master_port = store.port();
  r.world_size = 2;
  r.store_served = true;
  r.timeout = std::chrono::seconds(60);
  const pid_t child = ::fork();
  if (child == 0) {
    r.rank = 1;
    auto group = wrapcert::ProcessGroup::join(r);
    // Rank 0's calls in pairs, the second saying whether to go on.
    while (true) {
      (void)group->all_gather_text("x");
      if (group->all_gather_text("?")[0] == "stop") break;
    }
    ::_exit(0);
  }
  r.rank = 0;
  auto group = wrapcert::ProcessGroup::join(r);
  for (auto _ : state) {
    for (int i = 0; i < kTrips; ++i) {
      benchmark::DoNotOptimize(group->all_gather_text("x"));
      benchmark::DoNotOptimize(group->all_gather_text("go"));
    }
  }
  (void)group->all_gather_text("x");
  (void)group->all_gather_text("stop");
  int status = 0;
  ::waitpid(child, &status, 0);
  state.SetItemsProcessed(state.iterations() * kTrips * 2);
  state.counters["us_per_round_trip"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kTrips * 2,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

/// Runs `argv` with its output to /dev/null; its wall seconds and peak resident memory (MiB),
/// or nothing when it could not run or failed.
std::optional<std::pair<double, double>> run_measured(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (child < 0 || ::wait4(child, &status, 0, &usage) != child) return std::nullopt;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A listing's verdict is 0 (clean) or 1 (wrapper components found): both are a run.
  if (!WIFEXITED(status) || WEXITSTATUS(status) > 1) return std::nullopt;
  return std::make_pair(seconds, static_cast<double>(usage.ru_maxrss) / 1024.0);
}

/// A torch.distributed.checkpoint folder of `keys` small tensors
/// (`_fsdp_wrapped_module.layers.N.weight`, [8, 4] float32) sharded over two ranks as FSDP's
/// SHARDED_STATE_DICT saves it, written once per size by the DCP stand-in
/// (tools/dcp_standin.py) and removed when the run ends.
std::string dcp_folder(int64_t keys) {
  struct Made {
    std::map<int64_t, std::string> folders;
    ~Made() {
      std::error_code ignored;
      for (const auto& [n, f] : folders) std::filesystem::remove_all(f, ignored);
    }
  };
  static Made made;
  auto& folder = made.folders[keys];
  if (!folder.empty()) return folder;
  folder = (std::filesystem::temp_directory_path() /
            ("wrapcert-bench-dcp-" + std::to_string(::getpid()) + "-" + std::to_string(keys)))
               .string();
  const std::string script =
      "import sys; sys.path.insert(0, sys.argv[1]); import collections, torch, dcp_standin; "
      "state = collections.OrderedDict(('_fsdp_wrapped_module.layers.%d.weight' % i, "
      "torch.zeros(8, 4)) for i in range(int(sys.argv[3]))); "
      "dcp_standin.save(state, sys.argv[2], ranks=2)";
  if (!run_measured({"/usr/bin/python3", "-c", script, wrapcert::bench::tools_dir(), folder,
                     std::to_string(keys)})) {
    folder.clear();
  }
  return folder;
}

void BM_ListDistributedCheckpoint(benchmark::State& state) {
  // `check-keys` reading a DCP folder's .metadata (its pickle through the allow-list, every
  // chunk placed in a .distcp by size, no .distcp read): in process, and the whole tool run
  // once (its wall time and peak memory, LibTorch's start-up included).
  const int64_t keys = state.range(0);
  const auto folder = dcp_folder(keys);
  if (folder.empty()) {
    state.SkipWithError("the DCP stand-in (tools/dcp_standin.py) could not write the folder");
    return;
  }
  const double heap_before = heap_mb();
  double held = 0;
  for (auto _ : state) {
    const auto listing = wrapcert::read_checkpoint(folder, {/*data=*/false, ""});
    held = heap_mb() - heap_before;
    if (static_cast<int64_t>(listing.state.size()) != keys) {
      state.SkipWithError("the listing missed keys");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * keys);
  state.SetComplexityN(keys);
  state.counters["listing_heap_mb"] = held;
  if (!wrapcert::bench::tool().empty()) {
    if (const auto run = run_measured({wrapcert::bench::tool(), "check-keys", folder})) {
      state.counters["tool_seconds"] = run->first;
      state.counters["tool_peak_rss_mb"] = run->second;
    }
  }
}

// clang-format off
BENCHMARK(BM_NamedModulesWalk)->ArgName("modules")->RangeMultiplier(10)->Range(100, 100000)->Complexity(benchmark::oN);
BENCHMARK(BM_NamedParametersKeys)->ArgName("modules")->RangeMultiplier(10)->Range(100, 100000)->Complexity(benchmark::oN);
BENCHMARK(BM_UnwrapReference)->ArgName("modules")->RangeMultiplier(10)->Range(100, 100000)->Arg(60000)->Complexity(benchmark::oN);
BENCHMARK(BM_UnwrapLegacy)->ArgName("modules")->RangeMultiplier(10)->Range(100, 100000)->Arg(60000)->Complexity(benchmark::oN);
BENCHMARK(BM_UnwrapDuckTyped)->ArgName("modules")->RangeMultiplier(10)->Range(100, 100000)->Arg(60000)->Complexity(benchmark::oN);
BENCHMARK(BM_UnwrapReferenceChain)->ArgName("depth")->RangeMultiplier(10)->Range(1, 100000)->Complexity(benchmark::oN);
BENCHMARK(BM_UnwrapLegacyChain)->ArgName("depth")->RangeMultiplier(10)->Range(1, 100000)->Complexity(benchmark::oN);
BENCHMARK(BM_TranslatorChain)->ArgName("depth")->RangeMultiplier(10)->Range(10, 100000)->Complexity(benchmark::oN);
BENCHMARK(BM_WideTreeBuild)->ArgName("modules")->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond)->Iterations(1)->Complexity(benchmark::oN);
BENCHMARK(BM_WideTreeUnwrap)->ArgName("modules")->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond)->Complexity(benchmark::oN);
BENCHMARK(BM_WideTreeTranslator)->ArgName("modules")->Arg(10000)->Arg(100000)->Arg(1000000)->Unit(benchmark::kMillisecond)->Complexity(benchmark::oN);
BENCHMARK(BM_NamedModulesWalkLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_UnwrapReferenceLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_UnwrapLegacyLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_UnwrapDuckTypedLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_NamedParametersLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_StateDictViewLayout)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_BuildLayoutOnMeta)->ArgName("layout")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TranslateKeys)->ArgName("layout")->Arg(0)->Arg(1);
BENCHMARK(BM_PropertyStructural);
BENCHMARK(BM_PropertyStructuralAlone);
BENCHMARK(BM_PropertyBackward)->ArgName("dtype")->DenseRange(0, 3);
BENCHMARK(BM_PropertyTraining)->ArgName("dtype")->DenseRange(0, 3);
BENCHMARK(BM_CertifyOneKind)->ArgName("kind")->DenseRange(0, 3)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_CertifyPython)->ArgName("wrapper")->DenseRange(0, 2)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_CertifyPythonAcrossRanks)->ArgName("world_size")->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_CertifyAcrossRanks)->ArgNames({"kind", "world"})->ArgsProduct({{0, 1}, {2, 4}})->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_CollectiveRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ListDistributedCheckpoint)->ArgName("keys")->RangeMultiplier(10)->Range(1000, 100000)->Unit(benchmark::kMillisecond)->Complexity(benchmark::oN);
// clang-format on

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--rank-run") {
    g_certify_cases = std::stoi(argv[3]);
    return run_as_rank(argv[2]);
  }
  // Ours, taken out before Google Benchmark reads the rest.
  const std::string cases_flag = "--wrapcert_certify_cases=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(cases_flag, 0) != 0) continue;
    const auto value = arg.substr(cases_flag.size());
    char* end = nullptr;
    const long cases = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || cases < 1 || cases > 1000000) {
      std::cerr << "wrapcert_bench: " << arg
                << ": the cases must be a whole number from 1 to 1000000\n";
      return 2;
    }
    g_certify_cases = static_cast<int>(cases);
    std::copy(argv + i + 1, argv + argc + 1, argv + i);  // argv[argc] is the null pointer
    --argc;
    --i;
  }
  benchmark::AddCustomContext("certify_cases", std::to_string(g_certify_cases));
  benchmark::AddCustomContext("wrapcert_version", WRAPCERT_VERSION);
  benchmark::AddCustomContext("libtorch_version", TORCH_VERSION);
  benchmark::AddCustomContext("layouts", "layout:0 = gemma-2b, layout:1 = mistral-7b");
  // LibTorch's intra-op thread count as the benchmarks find it (they do not set it).
  benchmark::AddCustomContext("libtorch_threads", std::to_string(at::get_num_threads()));
#if defined(__clang__)
  benchmark::AddCustomContext("compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  benchmark::AddCustomContext("compiler", "gcc " __VERSION__);
#endif
#ifdef NDEBUG
  benchmark::AddCustomContext("assertions", "off (NDEBUG)");
#else
  benchmark::AddCustomContext("assertions", "on");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
