#include <wrapcert/fixtures/demo.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace wrapcert {
namespace {

using test_support::ChainImpl;
using test_support::ThrowsError;
using test_support::UserModuleImpl;

TEST(KeyTranslator, MapsTheSeedsKeyAndBack) {
  auto wrapped = auto_wrap(fixtures::make_demo_model(), {fixtures::kDemoNoSplitModule},
                           "SpmdFullyShardedDataParallel");
  auto tr = KeyTranslator::from_tree(wrapped);
  EXPECT_EQ(tr.to_clean("_orig_module.model.layers.1._orig_module.mlp.down_proj.weight"),
            "model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(tr.to_wrapped("model.norm.weight"), "_orig_module.model.norm.weight");
}

TEST(KeyTranslator, IsOneToOneKeepsOrderAndRoundTrips) {
  auto model = fixtures::make_demo_model();
  const auto original = keys(state_dict(model));  // wrapping below rewires `model` itself
  ModulePtr wrapped = wrap(model, "model.embed_tokens", "OptimizedModule");
  wrapped = wrap(wrapped, "model.embed_tokens", "DistributedDataParallel");
  wrapped = wrap(wrapped, "", "OptimizedModule");
  const auto wrapped_sd = state_dict(wrapped);
  auto tr = KeyTranslator::from_tree(wrapped);
  ASSERT_EQ(tr.size(), wrapped_sd.size());

  const auto clean = tr.to_clean(wrapped_sd);
  EXPECT_EQ(keys(clean), original);
  EXPECT_EQ(keys(tr.to_wrapped(clean)), keys(wrapped_sd));
  for (const auto& [w, c] : tr.pairs()) {
    EXPECT_TRUE(removes_whole_components(w, c)) << w << " -> " << c;
    EXPECT_EQ(tr.to_wrapped(tr.to_clean(w)), w);
  }
  EXPECT_EQ(tr.to_clean("_orig_mod.model.embed_tokens.module._orig_mod.weight"),
            "model.embed_tokens.weight");
}

TEST(KeyTranslator, LeavesUserNamesThatLookLikeSlotsAlone) {
  auto root = std::make_shared<ChainImpl>();
  root->register_module("my_fsdp_wrapped_module", torch::nn::Linear(2, 2));
  root->register_module("norm", std::make_shared<UserModuleImpl>("module"));
  root->register_module("orig", std::make_shared<UserModuleImpl>("_orig_mod"));
  const auto original = keys(state_dict(root));
  auto wrapped = wrap(root, "", "FullyShardedDataParallel");
  wrapped = wrap(wrapped, "_fsdp_wrapped_module.norm.module", "DataParallel");
  auto tr = KeyTranslator::from_tree(wrapped);
  EXPECT_EQ(tr.to_clean("_fsdp_wrapped_module.my_fsdp_wrapped_module.weight"),
            "my_fsdp_wrapped_module.weight");
  EXPECT_EQ(tr.to_clean("_fsdp_wrapped_module.norm.module.module.weight"), "norm.module.weight");
  EXPECT_EQ(tr.to_clean("_fsdp_wrapped_module.orig._orig_mod.bias"), "orig._orig_mod.bias");
  EXPECT_EQ(keys(tr.to_clean(state_dict(wrapped))), original);
}

TEST(KeyTranslator, NamesAnUnknownKey) {
  auto tr = KeyTranslator::from_tree(wrap(fixtures::make_demo_model(), "", "DataParallel"));
  EXPECT_THAT([&] { (void)tr.to_clean("module.model.layers.9.mlp.up_proj.weight"); },
              ThrowsError(ErrorCode::kUnknownKey, "module.model.layers.9.mlp.up_proj.weight"));
}

TEST(KeyTranslator, SaysAWrappersOwnStateHasNoCleanKey) {
  // The demo model's layers read their parameters through the registry: flat mode applies.
  auto wrapped =
      auto_wrap(fixtures::make_demo_model(), {fixtures::kDemoNoSplitModule},
                Registry::global().resolve("FullyShardedDataParallel[flat]").descriptor());
  const auto tr = KeyTranslator::from_tree(wrapped);
  const auto wrapped_keys = keys(state_dict(wrapped));
  ASSERT_THAT(wrapped_keys, ::testing::Contains("_flat_param"));
  try {
    (void)tr.to_clean("_flat_param");
    ADD_FAILURE() << "a flat parameter translated";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnknownKey);
    EXPECT_EQ(e.key_path(), "_flat_param");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("a wrapper's own state"));
  }
  // A key that is nowhere is not called a wrapper's.
  try {
    (void)tr.to_clean("_fsdp_wrapped_module.nowhere.weight");
    ADD_FAILURE() << "an unknown key translated";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("a wrapper's own state")));
  }
}

TEST(RemovesWholeComponents, AcceptsOnlyWholeComponentsInOrder) {
  EXPECT_TRUE(removes_whole_components("a.module.b.weight", "a.b.weight"));
  EXPECT_TRUE(removes_whole_components("module.weight", "weight"));
  EXPECT_FALSE(removes_whole_components("my_fsdp_wrapped_module.weight", "my_.weight"));
  EXPECT_FALSE(removes_whole_components("model.embed_tokens.weight", "der.embed_tokens.weight"));
  EXPECT_FALSE(removes_whole_components("a.b.weight", "b.a.weight"));
  EXPECT_FALSE(removes_whole_components("a.weight", "a.weight.extra"));
  // Empty components count: a trailing dot is a component the wrapped key lacks.
  EXPECT_FALSE(removes_whole_components("a.weight", "a.weight."));
  EXPECT_TRUE(removes_whole_components("a..weight", "a.weight"));
}

}  // namespace
}  // namespace wrapcert
