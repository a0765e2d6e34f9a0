// Unwrap cost against LibTorch's own walk over the same tree.
//   build/bench/wrapcert_bench --benchmark_out=bench.json --benchmark_out_format=json

#include <wrapcert/fixtures/demo.h>
#include <wrapcert/wrapcert.h>

#include <wrapcert/gen/generators.h>
#include <wrapcert/properties.h>

#include <benchmark/benchmark.h>
#include <rapidcheck/Random.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>

namespace {

using wrapcert::ModulePtr;

/// Custom parent that calls its children by name (like every wrapcert fixture).
struct NodeImpl : wrapcert::Layer {
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
};

/// A tree of about `n` modules: nodes with 4 children, Linear leaves, every 4th node wrapped.
ModulePtr wrapped_tree(int64_t n) {
  auto root = std::make_shared<NodeImpl>();
  std::vector<std::shared_ptr<torch::nn::Module>> frontier{root};
  int64_t count = 1;
  const auto& kinds = wrapcert::Registry::global().kinds();
  for (size_t i = 0; count < n; ++i) {
    const auto parent = frontier[i];  // a copy: push_back below may reallocate
    for (int c = 0; c < 4 && count < n; ++c, ++count) {
      ModulePtr child = (count % 8 == 0) ? ModulePtr(torch::nn::Linear(1, 1).ptr())
                                         : ModulePtr(std::make_shared<NodeImpl>());
      frontier.push_back(child);
      if (count % 4 == 0) child = kinds[count % kinds.size()].make(child);
      parent->register_module(std::to_string(c), child);
    }
  }
  return root;
}

ModulePtr chain(int64_t depth) {
  ModulePtr m = torch::nn::Linear(1, 1).ptr();
  const auto& kinds = wrapcert::Registry::global().kinds();
  for (int64_t i = 0; i < depth; ++i) m = kinds[i % kinds.size()].make(m);
  return m;
}

void BM_NamedModulesWalk(benchmark::State& state) {
  auto tree = wrapped_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(tree->named_modules());
  state.SetComplexityN(state.range(0));
}

void BM_UnwrapReference(benchmark::State& state) {
  auto tree = wrapped_tree(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_reference(tree));
  state.SetComplexityN(state.range(0));
}

void BM_UnwrapLegacy(benchmark::State& state) {
  auto tree = chain(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_legacy(tree));
  state.SetComplexityN(state.range(0));
}

void BM_UnwrapReferenceChain(benchmark::State& state) {
  auto tree = chain(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(wrapcert::unwrap_reference(tree));
  state.SetComplexityN(state.range(0));
}

void BM_TranslateKeys(benchmark::State& state) {
  wrapcert::fixtures::DemoConfig config;
  config.layers = state.range(0);
  auto wrapped =
      wrapcert::auto_wrap(wrapcert::fixtures::make_demo_model(config),
                          {wrapcert::fixtures::kDemoNoSplitModule}, "SpmdFullyShardedDataParallel");
  auto tr = wrapcert::KeyTranslator::from_tree(wrapped);
  std::vector<std::string> keys;
  for (const auto& [w, c] : tr.pairs()) keys.push_back(w);
  for (auto _ : state) {
    for (const auto& k : keys) benchmark::DoNotOptimize(tr.to_clean(k));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(keys.size()));
}

/// 64 specs drawn from the property suite's generator (fixed seed, size 50).
const std::vector<wrapcert::gen::TreeSpec>& sample_specs() {
  static const auto specs = [] {
    std::vector<wrapcert::gen::TreeSpec> out;
    rc::Random random(42);
    const auto trees = wrapcert::gen::trees();
    for (int i = 0; i < 64; ++i) out.push_back(trees(random.split(), 50).value());
    return out;
  }();
  return specs;
}

template <typename Check>
void run_property(benchmark::State& state, Check check) {
  const auto& specs = sample_specs();
  const auto reference = wrapcert::props::subject(wrapcert::Subject::kReference);
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(check(specs[i++ % specs.size()], reference));
  state.SetItemsProcessed(state.iterations());  // cases
}

void BM_PropertyStructural(benchmark::State& state) {
  // P1, P2, P3, P5, P6, P9 and P12 on one case: the structural properties.
  run_property(state, [](const auto& spec, const auto& u) {
    namespace props = wrapcert::props;
    return props::keys(spec, u).passed && props::identity(spec, u).passed &&
           props::ties(spec, u).passed && props::non_mutation(spec, u).passed &&
           props::laws(spec, u).passed && props::no_false_positives(spec, u).passed &&
           props::order(spec, u, 1).passed;
  });
}

void BM_PropertyBackward(benchmark::State& state) {
  run_property(state, [](const auto& spec, const auto& u) {
    return wrapcert::props::backward(spec, u).passed;
  });
}

BENCHMARK(BM_PropertyStructural);
BENCHMARK(BM_PropertyBackward);
BENCHMARK(BM_NamedModulesWalk)
    ->ArgName("modules")
    ->RangeMultiplier(10)
    ->Range(100, 100000)
    ->Complexity();
BENCHMARK(BM_UnwrapReference)
    ->ArgName("modules")
    ->RangeMultiplier(10)
    ->Range(100, 100000)
    ->Complexity();
BENCHMARK(BM_UnwrapLegacy)->ArgName("depth")->RangeMultiplier(10)->Range(1, 10000)->Complexity();
BENCHMARK(BM_UnwrapReferenceChain)
    ->ArgName("depth")
    ->RangeMultiplier(10)
    ->Range(1, 10000)
    ->Complexity();
BENCHMARK(BM_TranslateKeys)->ArgName("layers")->Arg(18)->Arg(32);

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("wrapcert_version", "0.1.0");
  benchmark::AddCustomContext("libtorch_version", TORCH_VERSION);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
