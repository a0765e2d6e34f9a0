#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/layer.h>
#include <wrapcert/test_support/ddp_batch.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/test_support/paths.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <spawn.h>
#include <sys/wait.h>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

extern char** environ;

namespace wrapcert {
namespace {

using fixtures::make_causal_lm;
using fixtures::tiny_gemma;
using fixtures::tiny_mistral;
using test_support::ThrowsError;

ModulePtr tiny(const fixtures::CausalLMConfig& config, uint64_t seed = 5) {
  return make_causal_lm(config, {c10::kCPU, c10::kDouble, seed});
}

torch::Tensor step_tokens() {
  return torch::tensor({{4, 8, 15, 16, 23, 42}}, torch::kLong);
}

/// Gradients of every parameter after one backward of the mean squared logits.
std::vector<torch::Tensor> grads_after_step(const ModulePtr& run, const ModulePtr& model) {
  call(*run, step_tokens()).pow(2).mean().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void expect_bitwise_equal(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "gradient " << i;
}

// ---- keys while wrapped: exactly the real wrapper's prefix ---------------------------------

TEST(WrapperZoo, EveryKindPutsItsRealSlotIntoKeys) {
  const std::map<std::string, std::string> expected = {
      {"DataParallel", "module."},
      {"DistributedDataParallel", "module."},
      {"FullyShardedDataParallel", "_fsdp_wrapped_module."},
      {"SpmdFullyShardedDataParallel", "_orig_module."},
      {"OptimizedModule", "_orig_mod."},
      {"CheckpointWrapper", "_checkpoint_wrapped_module."},
      {"DeepSpeedEngine", "module."},
      {"Fp32OutputWrapper", "module."},
  };
  ASSERT_EQ(Registry::with_builtins().kinds().size(), expected.size());
  for (const auto& [kind, prefix] : expected) {
    auto wrapped = wrap(tiny(tiny_gemma()), "", kind);
    EXPECT_EQ(keys(state_dict(wrapped)).front(), prefix + "model.embed_tokens.weight") << kind;
    EXPECT_EQ(python_type_name(*wrapped), kind);
  }
}

TEST(WrapperZoo, CompileAndDdpOrderGiveDifferentKeys) {
  // huggingface/transformers #22215; pytorch-image-models PR #2003.
  EXPECT_EQ(keys(state_dict(compile(ddp(tiny(tiny_mistral()))))).front(),
            "_orig_mod.module.model.embed_tokens.weight");
  EXPECT_EQ(keys(state_dict(ddp(compile(tiny(tiny_mistral()))))).front(),
            "module._orig_mod.model.embed_tokens.weight");
}

// ---- behaviour ------------------------------------------------------------------------------

TEST(WrapperZoo, PassThroughKindsGiveBitwiseEqualGradients) {
  for (const char* kind : {"DataParallel", "OptimizedModule", "DeepSpeedEngine",
                           "SpmdFullyShardedDataParallel", "FullyShardedDataParallel"}) {
    auto plain = tiny(tiny_gemma());
    auto model = tiny(tiny_gemma());
    auto wrapped = wrap(wrap(model, "model.layers.1", kind), "", kind);
    expect_bitwise_equal(grads_after_step(wrapped, model), grads_after_step(plain, plain));
  }
}

/// Counts how often it runs: shows recomputation.
struct CountingImpl : test_support::ChainImpl {
  int runs = 0;
  torch::Tensor forward(const torch::Tensor& x) override {
    ++runs;
    return ChainImpl::forward(x);
  }
};

TEST(CheckpointWrapper, RecomputesInBackwardWithBitwiseEqualGradients) {
  torch::manual_seed(1);
  auto make = [] {
    auto block = std::make_shared<CountingImpl>();
    block->register_module("fc1", torch::nn::Linear(4, 8));
    block->register_module("act", torch::nn::Tanh());
    block->register_module("fc2", torch::nn::Linear(8, 4));
    block->to(torch::kDouble);
    return block;
  };
  auto plain = make();
  auto inner = make();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) {
      inner->parameters()[i].copy_(plain->parameters()[i]);
    }
  }
  auto wrapped = std::make_shared<CheckpointWrapperImpl>(inner);
  const auto x = torch::randn({3, 4}, torch::kDouble).requires_grad_(true);
  const auto x2 = x.detach().clone().requires_grad_(true);

  call(*plain, x).pow(2).sum().backward();
  const auto y = call(*wrapped, x2);
  EXPECT_EQ(inner->runs, 1);
  y.pow(2).sum().backward();
  EXPECT_EQ(inner->runs, 2) << "backward recomputed the forward";
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_TRUE(plain->parameters()[i].grad().equal(inner->parameters()[i].grad())) << i;
  }
  EXPECT_TRUE(x.grad().equal(x2.grad()));
}

TEST(CheckpointWrapper, InPlaceCheckpointingAddsNoLevelAndKeepsGradients) {
  auto plain = tiny(tiny_mistral());
  auto model = tiny(tiny_mistral());
  auto wrapped = fsdp_v2_recipe(model, tiny_mistral().no_split_modules());
  EXPECT_EQ(keys(unwrap_reference(wrapped).state_dict()), keys(state_dict(plain)));
  EXPECT_TRUE(is_checkpointed(*module_at(model, "model.layers.0._orig_module")));
  expect_bitwise_equal(grads_after_step(wrapped, model), grads_after_step(plain, plain));
}

TEST(SpmdFullyShardedDataParallel, CallsShardOutputOnTheOutput) {
  std::vector<int64_t> seen;
  FsdpV2RecipeOptions options;
  options.shard_output = [&seen](const torch::Tensor& out) { seen = out.sizes().vec(); };
  auto wrapped = fsdp_v2_recipe(tiny(tiny_gemma()), tiny_gemma().no_split_modules(), options);
  (void)call(*wrapped, step_tokens());
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 6, tiny_gemma().vocab_size}));
}

TEST(Fp32OutputWrapper, ChangesOutputsButNotTheUnwrappedModel) {
  auto model = tiny(tiny_gemma());
  const auto original = call(*model, step_tokens());
  auto wrapped = wrap(model, "", "Fp32OutputWrapper");
  EXPECT_EQ(Registry::global().find(*wrapped)->numerics, Numerics::kChangesOutput);
  const auto out = call(*wrapped, step_tokens());
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_FALSE(out.to(torch::kDouble).equal(original)) << "float32 rounding is visible";
  ScopedUnwrap scope(wrapped);
  EXPECT_TRUE(call(*scope.root(), step_tokens()).equal(original));
}

TEST(FullyShardedDataParallel, ModuleSkipsACheckpointWrapperDirectlyUnder) {
  auto layer = torch::nn::Linear(2, 2).ptr();
  auto fsdp = std::make_shared<FullyShardedDataParallelImpl>(
      std::make_shared<CheckpointWrapperImpl>(layer));
  EXPECT_EQ(fsdp->module(), layer);
  EXPECT_NE(fsdp->inner(), layer);
  auto plain = std::make_shared<FullyShardedDataParallelImpl>(layer);
  EXPECT_EQ(plain->module(), layer);
}

TEST(OptimizedModule, PartialCompileLeavesOrigModForTheDuckTypedSubject) {
  // huggingface/accelerate #3683: only a submodule compiled.
  auto model = tiny(tiny_mistral());
  const auto original = keys(state_dict(tiny(tiny_mistral())));
  auto wrapped = compile_submodule(model, "model.layers.0.mlp");
  EXPECT_EQ(keys(unwrap_reference(wrapped).state_dict()), original);
  const auto duck = keys(unwrap(BuiltinUnwrap::kDuckTyped, wrapped).state_dict());
  EXPECT_THAT(duck, ::testing::Contains("model.layers.0.mlp._orig_mod.up_proj.weight"));
}

// ---- flat parameters -----------------------------------------------------------------------

/// tiny Mistral with its first decoder layer in a flat-parameter FSDP.
std::pair<ModulePtr, std::shared_ptr<FullyShardedDataParallelImpl>> flat_wrapped(uint64_t seed) {
  auto model = tiny(tiny_mistral(), seed);
  FsdpOptions options;
  options.flat_parameters = true;
  auto fsdp =
      std::make_shared<FullyShardedDataParallelImpl>(module_at(model, "model.layers.0"), options);
  replace_child(*module_at(model, "model.layers"), "0", fsdp);
  return {model, fsdp};
}

TEST(FullyShardedDataParallel, FlatParameterReplacesTheOriginalsInKeys) {
  const auto original = state_dict(tiny(tiny_mistral(), 9));
  auto [model, fsdp] = flat_wrapped(9);
  ASSERT_TRUE(fsdp->flat());
  const auto wrapped_keys = keys(state_dict(model));
  EXPECT_EQ(wrapped_keys.size(), original.size() - 9 + 1);
  EXPECT_EQ(wrapped_keys[1], "model.layers.0._flat_param");
  for (const auto& key : wrapped_keys) {
    EXPECT_EQ(key.find("layers.0._fsdp_wrapped_module"), std::string::npos) << key;
  }
  // The reference view shows the originals the wrapper holds, with their values (P1, P13).
  const auto view = unwrap_reference(model).state_dict();
  EXPECT_EQ(keys(view), keys(original));
  for (const auto& item : original) EXPECT_TRUE(view[item.key()].equal(item.value())) << item.key();
}

TEST(FullyShardedDataParallel, FlatRunIsBitwiseEqualAndGradientsReachTheFlatParameter) {
  auto plain = tiny(tiny_mistral(), 9);
  auto [model, fsdp] = flat_wrapped(9);
  EXPECT_TRUE(call(*model, step_tokens()).equal(call(*plain, step_tokens())));
  call(*model, step_tokens()).pow(2).mean().backward();
  call(*plain, step_tokens()).pow(2).mean().backward();
  const auto flat_grad = fsdp->named_parameters()["_flat_param"].grad();
  ASSERT_TRUE(flat_grad.defined());
  std::vector<torch::Tensor> expected;
  for (const auto& p : module_at(plain, "model.layers.0")->parameters()) {
    expected.push_back(p.grad().reshape(-1));
  }
  EXPECT_TRUE(flat_grad.equal(torch::cat(expected)));
}

TEST(FullyShardedDataParallel, ReleaseRestoresTheVeryOriginalsWithCurrentValues) {
  auto [model, fsdp] = flat_wrapped(9);
  const auto held = unwrap_reference(model).state_dict();  // the original tensors
  {
    torch::NoGradGuard no_grad;
    fsdp->named_parameters()["_flat_param"].add_(1.0);  // an optimizer step on the flat param
  }
  const auto inner = fsdp->release();
  EXPECT_FALSE(fsdp->flat());
  EXPECT_EQ(inner, module_at(model, "model.layers.0._fsdp_wrapped_module"));
  const auto restored = unwrap_reference(model).state_dict();
  EXPECT_EQ(keys(restored), keys(state_dict(tiny(tiny_mistral(), 9))));
  const auto before = state_dict(tiny(tiny_mistral(), 9));
  for (const auto& item : restored) {
    EXPECT_TRUE(item.value().is_same(held[item.key()])) << item.key();  // P2: same tensors
    const bool in_layer = item.key().rfind("model.layers.0.", 0) == 0;
    const auto expected = in_layer ? before[item.key()] + 1.0 : before[item.key()];
    EXPECT_TRUE(item.value().equal(expected)) << item.key();  // P13: the flat values
  }
  EXPECT_TRUE(wrapped_state(unwrap_reference(model)).is_empty());
  EXPECT_EQ(keys(state_dict(model))[1],
            "model.layers.0._fsdp_wrapped_module.self_attn.q_proj.weight");
}

TEST(FullyShardedDataParallel, UnreleasedFlatModuleRefusesToRunUnwrapped) {
  // huggingface/transformers #39619, pytorch/pytorch #82461: forward on the unwrapped module.
  auto [model, fsdp] = flat_wrapped(9);
  ScopedUnwrap scope(model);
  EXPECT_THAT([&] { (void)call(*scope.root(), step_tokens()); },
              ThrowsError(ErrorCode::kWrapperState, ::testing::_, ::testing::HasSubstr("release")));
}

TEST(FullyShardedDataParallel, AutoWrapWithFlatParametersLeavesOnlyFlatKeys) {
  const auto original = state_dict(tiny(tiny_gemma()));
  FsdpOptions options;
  options.flat_parameters = true;
  auto wrapped = fsdp_v1_auto_wrap(tiny(tiny_gemma()), tiny_gemma().no_split_modules(), options);
  // Each layer flattens its own; the root flattens the embedding, the final norm and the head.
  EXPECT_THAT(
      keys(state_dict(wrapped)),
      ::testing::ElementsAre("_flat_param", "_fsdp_wrapped_module.model.layers.0._flat_param",
                             "_fsdp_wrapped_module.model.layers.1._flat_param"));
  const auto view = unwrap_reference(wrapped).state_dict();
  EXPECT_EQ(keys(view), keys(original));
  EXPECT_TRUE(view["lm_head.weight"].is_same(view["model.embed_tokens.weight"])) << "P3";
  EXPECT_TRUE(call(*wrapped, step_tokens()).equal(call(*tiny(tiny_gemma()), step_tokens())));
}

// ---- DistributedDataParallel ----------------------------------------------------------------

TEST(DistributedDataParallel, AveragesOverASingleProcessGroup) {
  auto plain = tiny(tiny_mistral());
  auto model = tiny(tiny_mistral());
  auto wrapped = std::make_shared<DistributedDataParallelImpl>(model);
  EXPECT_EQ(wrapped->process_group()->size(), 1);
  expect_bitwise_equal(grads_after_step(wrapped, model), grads_after_step(plain, plain));
  EXPECT_EQ(wrapped->reductions(), static_cast<int64_t>(model->parameters().size()));

  // A run of the inner module alone is not reduced.
  (void)grads_after_step(model, model);
  EXPECT_EQ(wrapped->reductions(), static_cast<int64_t>(model->parameters().size()));
}

/// Starts `world` worker processes on loopback and waits (bounded) for all of them.
std::vector<std::vector<torch::Tensor>> run_ranks(int world) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("wrapcert-ddp-" + std::to_string(::getpid()) + "-" + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {test_support::ddp_worker(), store, std::to_string(rank),
                                     std::to_string(world),
                                     (dir / ("grads" + std::to_string(rank) + ".pt")).string()};
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ADD_FAILURE() << "a rank did not finish within 60 s";
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank exited with " << status;
  }
  std::vector<std::vector<torch::Tensor>> grads(world);
  for (int rank = 0; rank < world; ++rank) {
    torch::load(grads[rank], (dir / ("grads" + std::to_string(rank) + ".pt")).string());
  }
  std::filesystem::remove_all(dir);
  return grads;
}

class DistributedDataParallelRanks : public ::testing::TestWithParam<int> {};

TEST_P(DistributedDataParallelRanks, OnLoopbackAverageGradientsEquallyOnEveryRank) {
  const int world = GetParam();
  const auto grads = run_ranks(world);
  ASSERT_EQ(grads.size(), static_cast<size_t>(world));
  for (int rank = 1; rank < world; ++rank) expect_bitwise_equal(grads[0], grads[rank]);

  // The single-process gradient of the loss averaged over every rank's batch.
  auto model = make_causal_lm(tiny_mistral(), {c10::kCPU, c10::kDouble, /*seed=*/11});
  auto loss = test_support::ddp_loss(call(*model, test_support::ddp_batch(0)));
  for (int rank = 1; rank < world; ++rank) {
    loss = loss + test_support::ddp_loss(call(*model, test_support::ddp_batch(rank)));
  }
  (loss / world).backward();
  const auto params = model->parameters();
  ASSERT_EQ(params.size(), grads[0].size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(grads[0][i], params[i].grad(), 1e-12, 1e-14)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelRanks, ::testing::Values(2, 3, 4));

TEST(DistributedDataParallel, UnwrapsToTheSameKeysOnEveryRank) {
  auto a = ddp(tiny(tiny_mistral(), 1));
  auto b = ddp(tiny(tiny_mistral(), 2));
  EXPECT_EQ(keys(unwrap_reference(a).state_dict()), keys(unwrap_reference(b).state_dict()));
}

}  // namespace
}  // namespace wrapcert
