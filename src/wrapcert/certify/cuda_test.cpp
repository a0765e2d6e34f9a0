// The tiny fixtures and generated trees on a CUDA device: P1-P5 and P13 with the models moved
// to the GPU. Skipped, with the reason, where LibTorch has no CUDA device (label `gpu`).

#include <wrapcert/certify/hardware_gtest.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/wrapcert.h>

#include <gtest/gtest.h>
#include <rapidcheck/Random.h>

namespace wrapcert {
namespace {

class OnCuda : public ::testing::TestWithParam<fixtures::CausalLMConfig> {};

TEST_P(OnCuda, TinyFixtureUnwrapsAndComputesOnTheGpu) {
  WRAPCERT_REQUIRE_CUDA();
  const auto& config = GetParam();
  const fixtures::BuildOptions cpu{c10::kCPU, c10::kDouble, 4};
  const fixtures::BuildOptions gpu{c10::Device(c10::kCUDA, 0), c10::kDouble, 4};
  auto plain = fixtures::make_causal_lm(config, cpu);
  plain->to(gpu.device);
  auto model = fixtures::make_causal_lm(config, cpu);
  model->to(gpu.device);
  const auto original = state_dict(model);
  auto wrapped = fixtures::apply_fsdp_v2_recipe(model, config);
  const auto tree = format_tree(wrapped);
  const auto view = unwrap_reference(wrapped);
  const auto unwrapped = view.state_dict();
  EXPECT_EQ(keys(unwrapped), keys(original));  // P1
  for (const auto& item : original) {
    EXPECT_TRUE(unwrapped[item.key()].is_same(item.value())) << item.key();  // P2
    EXPECT_TRUE(item.value().is_cuda());
  }
  EXPECT_TRUE(unwrapped["lm_head.weight"].is_same(unwrapped["model.embed_tokens.weight"]) ==
              config.tie_word_embeddings);  // P3
  // P4, within the checkpoint wrapper's tolerance: recomputation reorders gradient sums.
  const auto ids = torch::tensor({{2, 7, 1, 8}}, torch::dtype(torch::kLong).device(gpu.device));
  auto expected = call(*plain, ids);
  expected.pow(2).mean().backward();
  auto out = call(*wrapped, ids);
  out.pow(2).mean().backward();
  EXPECT_TRUE(torch::allclose(out, expected, 1e-10, 1e-10));
  const auto a = plain->named_parameters();
  for (const auto& item : original) {
    EXPECT_TRUE(torch::allclose(item.value().grad(), a[item.key()].grad(), 1e-9, 1e-9))
        << item.key();
  }
  EXPECT_EQ(format_tree(wrapped), tree);  // P5
  const auto values = state_dict(fixtures::make_causal_lm(config, cpu));
  for (const auto& item : values) {  // P13
    EXPECT_TRUE(unwrapped[item.key()].cpu().equal(item.value())) << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OnCuda,
                         ::testing::Values(fixtures::tiny_gemma(), fixtures::tiny_mistral()),
                         [](const auto& info) {
                           return info.param.name == "tiny-gemma" ? std::string("TinyGemma")
                                                                  : std::string("TinyMistral");
                         });

TEST(OnCudaGenerated, TreesUnwrapWithTheirTensorsOnTheGpu) {
  WRAPCERT_REQUIRE_CUDA();
  rc::Random random(7);
  const auto trees = gen::trees();
  for (int i = 0; i < 50; ++i) {
    const auto spec = trees(random.split(), 40).value();
    auto built = gen::build(spec, {c10::kDouble, 0, /*wrap=*/false});
    built.root->to(c10::Device(c10::kCUDA, 0));
    const auto original = state_dict(built.root);
    auto wrapped = gen::build(spec);  // same structure, wrapped, then moved
    wrapped.root->to(c10::Device(c10::kCUDA, 0));
    const auto u = unwrap_reference(wrapped.root).state_dict();
    EXPECT_EQ(keys(u), keys(original)) << gen::describe(spec);
    for (const auto& item : u) EXPECT_TRUE(item.value().is_cuda()) << item.key();
  }
}

}  // namespace
}  // namespace wrapcert
