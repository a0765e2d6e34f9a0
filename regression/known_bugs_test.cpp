// One case per known real-world unwrap bug (docs/SEMANTICS.md §2). Each passes against the
// reference unwrap and is asserted to fail against the subject that has the bug.

#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <map>

namespace wrapcert {
namespace {

using fixtures::make_causal_lm;
using test_support::ThrowsError;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

ModulePtr tiny_mistral(uint64_t seed = 0) {
  return make_causal_lm(fixtures::tiny_mistral(), {c10::kCPU, c10::kDouble, seed});
}
ModulePtr tiny_gemma(uint64_t seed = 0) {
  return make_causal_lm(fixtures::tiny_gemma(), {c10::kCPU, c10::kDouble, seed});
}
ModulePtr gemma_2b() {
  return make_causal_lm(fixtures::gemma_2b(), {c10::kMeta});
}

std::vector<std::string> unwrapped_keys(BuiltinUnwrap s, const ModulePtr& wrapped) {
  return keys(unwrap(s, wrapped).state_dict());
}

// ---- hazard 2: duck typing ------------------------------------------------------------------

// fangwei123456/spikingjelly PR #686 (review); Lightning-AI/pytorch-lightning #17566: a user
// module that keeps a child named `module` is taken for a wrapper.
TEST(KnownBug, NormLayerWithAModuleChildIsNotAWrapper) {
  auto model = std::make_shared<test_support::ChainImpl>();
  model->register_module("norm", std::make_shared<test_support::UserModuleImpl>("module"));
  const auto original = keys(state_dict(model));
  auto wrapped = wrap(model, "", "DistributedDataParallel");
  EXPECT_EQ(unwrapped_keys(BuiltinUnwrap::kReference, wrapped), original);
  EXPECT_NE(unwrapped_keys(BuiltinUnwrap::kDuckTyped, wrapped), original)
      << "duck typing drops the norm's own scale and its `extra` child";
}

// ---- hazard 3: mutation ---------------------------------------------------------------------

// huggingface/transformers #37519, PR #37725; optimum-habana PR #2028: unwrapping rewires the
// live model, which then trains without its wrappers.
TEST(KnownBug, RecursiveUnwrapMutatesTheLiveModel) {
  auto config = fixtures::tiny_mistral();
  auto wrapped = fsdp_v2_recipe(tiny_mistral(), config.no_split_modules());
  const auto tree = format_tree(wrapped);
  (void)unwrap_reference(wrapped);
  EXPECT_EQ(format_tree(wrapped), tree);
  (void)unwrap_duck_typed(wrapped);
  EXPECT_NE(format_tree(wrapped), tree) << "the duck-typed unwrap rewired the model in place";
}

// huggingface/transformers PR #34452: a caller relied on the in-place mutation. The supported
// way to get a runnable unwrapped model is a scope that puts everything back.
TEST(KnownBug, CallersWhoNeedARunnableUnwrappedModelGetAScope) {
  auto wrapped = fsdp_v2_recipe(tiny_mistral(), fixtures::tiny_mistral().no_split_modules());
  const auto tree = format_tree(wrapped);
  const auto ids = torch::tensor({{1, 2, 3}}, torch::kLong);
  const auto expected = call(*tiny_mistral(), ids);
  {
    ScopedUnwrap scope(wrapped);
    EXPECT_TRUE(call(*scope.root(), ids).equal(expected));
  }
  EXPECT_EQ(format_tree(wrapped), tree);
}

// ---- compile --------------------------------------------------------------------------------

// huggingface/accelerate #3683, PR #3881: only a submodule compiled; `_orig_mod` stays inside.
TEST(KnownBug, CompiledSubmoduleLeavesOrigModInsideAWrappedModel) {
  const auto original = keys(state_dict(tiny_mistral()));
  auto wrapped = ddp(compile_submodule(tiny_mistral(), "model.layers.1.self_attn"));
  EXPECT_EQ(unwrapped_keys(BuiltinUnwrap::kReference, wrapped), original);
  EXPECT_THAT(unwrapped_keys(BuiltinUnwrap::kDuckTyped, wrapped),
              Contains(HasSubstr("self_attn._orig_mod.")));
}

/// nanoGPT's and train-llm-from-scratch's fix: strip one known prefix with a single `if`.
std::string strip_one_prefix(const std::string& key) {
  for (const std::string prefix : {"_orig_mod.", "module."}) {
    if (key.rfind(prefix, 0) == 0) return key.substr(prefix.size());
  }
  return key;
}

// huggingface/transformers #22215; pytorch-image-models PR #2003: compile(DDP(m)) and
// DDP(compile(m)) nest the prefixes in opposite orders. karpathy/nanoGPT #325;
// FareedKhan-dev/train-llm-from-scratch #36: a single `if` stripped only one of the two.
TEST(KnownBug, CompileAndDdpInEitherOrderUnwrapToTheSameKeys) {
  const auto original = keys(state_dict(tiny_gemma()));
  for (auto wrapped : {compile(ddp(tiny_gemma())), ddp(compile(tiny_gemma()))}) {
    EXPECT_EQ(unwrapped_keys(BuiltinUnwrap::kReference, wrapped), original);
    const auto tr = KeyTranslator::from_tree(wrapped);
    std::vector<std::string> stripped;
    for (const auto& [w, c] : tr.pairs()) {
      EXPECT_EQ(c, strip_one_prefix(strip_one_prefix(w)));
      stripped.push_back(strip_one_prefix(w));
    }
    EXPECT_NE(stripped, original) << "one `if` leaves the second prefix in";
  }
}

// ---- hazard 4: rewriting keys by spelling ---------------------------------------------------

std::string replace_all(std::string key, const std::string& token) {
  for (auto at = key.find(token); at != std::string::npos; at = key.find(token)) {
    key.erase(at, token.size());
  }
  return key;
}

// docs/SEMANTICS.md hazard 4: `key.replace("_fsdp_wrapped_module.", "")` also hits a user child
// whose name contains the token.
TEST(KnownBug, SubstringRewritingManglesUserNames) {
  auto model = std::make_shared<test_support::ChainImpl>();
  model->register_module("my_fsdp_wrapped_module", torch::nn::Linear(2, 2));
  auto wrapped = wrap(model, "", "FullyShardedDataParallel");
  const auto tr = KeyTranslator::from_tree(wrapped);
  EXPECT_EQ(tr.to_clean("_fsdp_wrapped_module.my_fsdp_wrapped_module.weight"),
            "my_fsdp_wrapped_module.weight");
  EXPECT_EQ(
      replace_all("_fsdp_wrapped_module.my_fsdp_wrapped_module.weight", "_fsdp_wrapped_module."),
      "myweight");
}

// ray-project/ray PR #43594: blind prefix slicing (`key[len(prefix):]`) on keys that do not
// carry the prefix produced `der.embed_tokens.weight`.
TEST(KnownBug, BlindPrefixSlicingCorruptsKeys) {
  const std::string key = "model.decoder.embed_tokens.weight";  // saved without a wrapper
  EXPECT_EQ(key.substr(std::string("_orig_mod.").size()), "der.embed_tokens.weight");
  // The translator works from the tree: a key the wrapped model does not have is an error, and
  // every translated key loses whole components only.
  auto wrapped = compile(tiny_mistral());
  const auto tr = KeyTranslator::from_tree(wrapped);
  EXPECT_THROW((void)tr.to_clean("model.embed_tokens.weight"), Error);
  for (const auto& [w, c] : tr.pairs()) EXPECT_TRUE(removes_whole_components(w, c)) << w;
}

// ---- hazard 5: translations that are not one-to-one ----------------------------------------

// pytorch/pytorch #101107; huggingface/pytorch-image-models #1566: keys collapsed or deleted.
TEST(KnownBug, TranslationIsOneToOneWhereStrippingEveryModuleCollapsesKeys) {
  auto model = std::make_shared<test_support::ChainImpl>();
  auto block = std::make_shared<test_support::ChainImpl>();
  block->register_parameter("weight", torch::ones({2}));
  block->register_module("module", torch::nn::Linear(2, 2));  // a user child named `module`
  model->register_module("b", block);
  auto wrapped = wrap(model, "", "DataParallel");
  const auto tr = KeyTranslator::from_tree(wrapped);
  EXPECT_EQ(tr.to_clean("module.b.weight"), "b.weight");
  EXPECT_EQ(tr.to_clean("module.b.module.weight"), "b.module.weight");
  const std::vector<std::string> clean{"b.weight", "b.module.weight", "b.module.bias"};
  EXPECT_EQ(keys(tr.to_clean(state_dict(wrapped))), clean);
  // Stripping every `module.` component sends two keys to `b.weight`.
  EXPECT_EQ(replace_all("module.b.weight", "module."),
            replace_all("module.b.module.weight", "module."));
}

// pytorch/pytorch #106942, #74162: prefix removal reordered keys.
TEST(KnownBug, TranslationKeepsKeyOrder) {
  auto wrapped = fsdp_v2_recipe(tiny_gemma(), fixtures::tiny_gemma().no_split_modules());
  const auto translated = KeyTranslator::from_tree(wrapped).to_clean(state_dict(wrapped));
  EXPECT_EQ(keys(translated), keys(state_dict(tiny_gemma())));
  auto sorted = keys(translated);
  std::sort(sorted.begin(), sorted.end());  // what a dict rebuilt from a set gives
  EXPECT_NE(sorted, keys(translated));
}

// ---- hazard 6: ties -------------------------------------------------------------------------

// huggingface/accelerate #2958, PR #2959 (reverted by PR #3096); EvolvingLMMs-Lab/lmms-engine
// PR #157: gemma's tied lm_head came apart or was saved twice.
TEST(KnownBug, GemmaTiedHeadStaysOneTensor) {
  auto wrapped = fixtures::apply_fsdp_v2_recipe(gemma_2b(), fixtures::gemma_2b());
  const auto sd = unwrap_reference(wrapped).state_dict();
  EXPECT_TRUE(sd["lm_head.weight"].is_same(sd["model.embed_tokens.weight"]));
  // The flat listing shows one storage for both keys.
  const auto listing = format_keys(sd);
  EXPECT_THAT(listing, HasSubstr("lm_head.weight                                   "
                                 "[256000, 2048]  float32  #0"));
}

// ---- hazard 7: graphs -----------------------------------------------------------------------

// pytorch DCP `_get_fqns` keeps a visited set; accelerate's recursion has none: a shared
// submodule is one node, reached by two paths, its tensors the same under both keys.
TEST(KnownBug, SharedSubmoduleIsUnwrappedOnce) {
  auto shared = torch::nn::Linear(2, 2);
  auto model = std::make_shared<test_support::ChainImpl>();
  auto left = std::make_shared<test_support::ChainImpl>();
  auto right = std::make_shared<test_support::ChainImpl>();
  left->register_module("proj", shared);
  right->register_module("proj", shared);
  model->register_module("left", left);
  model->register_module("right", right);
  auto wrapped = wrap(wrap(model, "left.proj", "CheckpointWrapper"), "right.proj", "DataParallel");
  const auto view = unwrap_reference(wrapped);
  EXPECT_EQ(view.size(), 4u);
  const auto sd = view.state_dict();
  EXPECT_TRUE(sd["left.proj.weight"].is_same(sd["right.proj.weight"]));
}

// ---- checkpoints ----------------------------------------------------------------------------

// A state dict saved from a wrapped model loads into the unwrapped one only after translation,
// and fails loudly, naming the key, without it.
TEST(KnownBug, WrappedCheckpointFailsLoudlyWithoutTranslation) {
  auto wrapped = fsdp_v2_recipe(tiny_mistral(1), fixtures::tiny_mistral().no_split_modules());
  const auto saved = state_dict(wrapped);
  auto fresh = tiny_mistral(2);
  EXPECT_THAT([&] { load_state_dict(fresh, saved); },
              ThrowsError(ErrorCode::kUnknownKey, "_orig_module.model.embed_tokens.weight"));
  EXPECT_FALSE(state_dict(fresh)["lm_head.weight"].equal(saved[saved.size() - 1].value()))
      << "nothing was copied by the failed load";
  load_state_dict(fresh, KeyTranslator::from_tree(wrapped).to_clean(saved));
  for (const auto& item : unwrap_reference(wrapped).state_dict()) {
    EXPECT_TRUE(state_dict(fresh)[item.key()].equal(item.value())) << item.key();
  }
}

// ---- FSDP ---------------------------------------------------------------------------------

// torch FSDP's `.module` skips a checkpoint wrapper right under it.
TEST(KnownBug, FsdpModuleSkipsTheCheckpointWrapper) {
  auto layer = module_at(tiny_gemma(), "model.layers.0");
  auto fsdp = std::make_shared<FullyShardedDataParallelImpl>(
      std::make_shared<CheckpointWrapperImpl>(layer));
  EXPECT_EQ(fsdp->module(), layer);
  EXPECT_EQ(unwrap_reference(fsdp).root().module, layer);
  EXPECT_NE(unwrap_legacy(fsdp->inner()), fsdp->inner()) << "the chain has two levels";
}

// huggingface/transformers #39619; huggingface/accelerate PR #1753; pytorch/pytorch #82461:
// forward on an unwrapped flat-parameter FSDP module (`'weight' must be 2-D`). It must be
// refused, or run after release on the restored parameters.
TEST(KnownBug, ForwardOnAnUnwrappedFlatModuleIsRefusedThenRestored) {
  auto model = tiny_mistral(3);
  FsdpOptions options;
  options.flat_parameters = true;
  auto wrapped = fsdp_v1_auto_wrap(model, fixtures::tiny_mistral().no_split_modules(), options);
  const auto ids = torch::tensor({{5, 6, 7}}, torch::kLong);
  const auto expected = call(*tiny_mistral(3), ids);
  EXPECT_TRUE(call(*wrapped, ids).equal(expected));
  EXPECT_THAT([&] { (void)call(*unwrap_legacy(wrapped), ids); },
              ThrowsError(ErrorCode::kWrapperState));
  // Release every FSDP (innermost first) and the unwrapped model computes again.
  std::vector<std::shared_ptr<FullyShardedDataParallelImpl>> fsdps;
  const auto as_is = ModuleView::of(wrapped);
  for (size_t i = 0; i < as_is.size(); ++i) {
    if (auto f = std::dynamic_pointer_cast<FullyShardedDataParallelImpl>(as_is.node(i).module)) {
      fsdps.push_back(f);
    }
  }
  ASSERT_EQ(fsdps.size(), 3u);
  for (auto it = fsdps.rbegin(); it != fsdps.rend(); ++it) (*it)->release();
  EXPECT_TRUE(call(*unwrap_legacy(wrapped), ids).equal(expected));
  EXPECT_THAT(keys(state_dict(model)), Not(Contains(HasSubstr("_flat_param"))));
}

}  // namespace
}  // namespace wrapcert
