// Regressions from the seed thread: huggingface/transformers #29659, PR #29780 (hazard 1).
// The contributor's two tests, ported from Python on the layout they used (Mistral-7B-v0.1,
// full size on the meta device), and the seed's gemma-2b recipe.

#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace wrapcert {
namespace {

constexpr const char* kFsdp2 = "SpmdFullyShardedDataParallel";

ModulePtr mistral() {
  return fixtures::make_causal_lm(fixtures::mistral_7b(), {c10::kMeta, c10::kBFloat16});
}

std::vector<std::string> subject_keys(BuiltinUnwrap subject, const ModulePtr& wrapped) {
  return keys(unwrap(subject, wrapped).state_dict());
}

/// The thread's `compare_state_dict_keys`: `zip` stops at the shorter list.
bool zip_compare(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

TEST(SeedThread, CompatibilityWithTheOriginalBehaviour) {
  // test_compatibility_with_original_behavior: one wrapper at the root.
  auto wrapped = wrap(mistral(), "", kFsdp2);
  EXPECT_EQ(subject_keys(BuiltinUnwrap::kReference, wrapped),
            subject_keys(BuiltinUnwrap::kLegacy, wrapped));
}

TEST(SeedThread, NestedUnwrapModules) {
  // test_nested_unwrap_modules: the embedding wrapped as well as the root.
  auto model = mistral();
  const auto original = keys(state_dict(model));
  auto wrapped = wrap(wrap(model, "model.embed_tokens", kFsdp2), "", kFsdp2);
  EXPECT_NE(subject_keys(BuiltinUnwrap::kLegacy, wrapped), original);
  EXPECT_EQ(subject_keys(BuiltinUnwrap::kReference, wrapped), original);
}

TEST(SeedThread, StrictComparisonCatchesAMissingKeyThatZipMisses) {
  auto model = mistral();
  const auto original = keys(state_dict(model));
  auto truncated = original;
  truncated.pop_back();  // what a subject that silently dropped the head would give
  ASSERT_EQ(original.back(), "lm_head.weight");
  EXPECT_TRUE(zip_compare(truncated, original)) << "the thread's check passes a lost key";
  EXPECT_NE(truncated, original);
}

TEST(SeedThread, TheFixFailsWithoutTheFix) {
  // The reviewer's request: the nested test must fail against the pre-fix unwrap.
  auto wrapped = wrap(wrap(mistral(), "model.embed_tokens", kFsdp2), "", kFsdp2);
  const auto expected = keys(state_dict(mistral()));
  EXPECT_EQ(subject_keys(BuiltinUnwrap::kReference, wrapped), expected);
  const auto legacy = unwrap(BuiltinUnwrap::kLegacy, wrapped);
  EXPECT_NE(keys(legacy.state_dict()), expected) << "the same test, run on the pre-fix unwrap";
  EXPECT_EQ(wrapped_state(legacy).size(), 1u);
}

TEST(SeedThread, Gemma2bRecipeLeavesOrigModuleIn162Of165KeysUnderLegacy) {
  auto config = fixtures::gemma_2b();
  auto wrapped =
      fixtures::apply_fsdp_v2_recipe(fixtures::make_causal_lm(config, {c10::kMeta}), config);
  const auto legacy = unwrap(BuiltinUnwrap::kLegacy, wrapped);
  ASSERT_EQ(legacy.state_dict().size(), 165u);
  EXPECT_EQ(wrapped_state(legacy).size(), 162u);
  size_t with_slot = 0;
  for (const auto& key : keys(legacy.state_dict())) {
    with_slot += key.find("._orig_module.") != std::string::npos;
  }
  EXPECT_EQ(with_slot, 162u);
  const auto reference = unwrap_reference(wrapped);
  EXPECT_TRUE(wrapped_state(reference).is_empty());
  EXPECT_EQ(keys(reference.state_dict()),
            keys(state_dict(fixtures::make_causal_lm(config, {c10::kMeta}))));
}

}  // namespace
}  // namespace wrapcert
