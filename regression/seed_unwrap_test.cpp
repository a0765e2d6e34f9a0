// Regressions from the seed thread: huggingface/transformers #29659, PR #29780 (hazard 1).
// The contributor's two tests, ported from Python to the demo model; the full Mistral-7B and
// gemma-2b layouts replace it when the fixtures land.

#include <wrapcert/fixtures/demo.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace wrapcert {
namespace {

constexpr const char* kFsdp2 = "SpmdFullyShardedDataParallel";

std::vector<std::string> subject_keys(Subject subject, const ModulePtr& wrapped) {
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
  auto wrapped = wrap(fixtures::make_demo_model(), "", kFsdp2);
  EXPECT_EQ(subject_keys(Subject::kReference, wrapped), subject_keys(Subject::kLegacy, wrapped));
}

TEST(SeedThread, NestedUnwrapModules) {
  // test_nested_unwrap_modules: the embedding wrapped as well as the root.
  auto model = fixtures::make_demo_model();
  const auto original = keys(state_dict(model));
  auto wrapped = wrap(wrap(model, "model.embed_tokens", kFsdp2), "", kFsdp2);
  EXPECT_NE(subject_keys(Subject::kLegacy, wrapped), original);
  EXPECT_EQ(subject_keys(Subject::kReference, wrapped), original);
}

TEST(SeedThread, StrictComparisonCatchesAMissingKeyThatZipMisses) {
  auto model = fixtures::make_demo_model();
  const auto original = keys(state_dict(model));
  auto truncated = original;
  truncated.pop_back();  // a subject that silently dropped `lm_head.weight`
  EXPECT_TRUE(zip_compare(truncated, original)) << "the thread's check passes a lost key";
  EXPECT_NE(truncated, original);
}

TEST(SeedThread, TheFixFailsWithoutTheFix) {
  // The reviewer's request: the nested test must fail against the pre-fix unwrap.
  auto wrapped = auto_wrap(fixtures::make_demo_model(), {fixtures::kDemoNoSplitModule}, kFsdp2);
  const auto expected = keys(state_dict(fixtures::make_demo_model()));
  EXPECT_EQ(subject_keys(Subject::kReference, wrapped), expected);
  const auto legacy = unwrap(Subject::kLegacy, wrapped);
  EXPECT_NE(keys(legacy.state_dict()), expected);
  EXPECT_EQ(wrapped_state(legacy).size(), 18u) << "every key of both decoder layers";
}

}  // namespace
}  // namespace wrapcert
