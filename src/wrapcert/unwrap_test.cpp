#include <wrapcert/fixtures/demo.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace wrapcert {
namespace {

using fixtures::DemoConfig;
using fixtures::make_demo_model;
using test_support::ChainImpl;
using test_support::HasKeys;
using test_support::same_tensors;
using test_support::ThrowsError;
using test_support::UserModuleImpl;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kFsdp2 = "SpmdFullyShardedDataParallel";

/// Every wrapper reachable in `root` (wrappers included), by walking the tree as it is.
std::vector<std::shared_ptr<WrapperImpl>> wrappers_in(const ModulePtr& root) {
  std::vector<std::shared_ptr<WrapperImpl>> out;
  auto view = ModuleView::of(root);
  for (size_t i = 0; i < view.size(); ++i) {
    if (auto w = std::dynamic_pointer_cast<WrapperImpl>(view.node(i).module)) out.push_back(w);
  }
  return out;
}

torch::Tensor tokens() {
  return torch::tensor({{1, 4, 2, 7, 3}}, torch::kLong);
}

/// The seed's wrapping plus wrappers in odd places: a stack on the embedding, one on the head.
ModulePtr heavily_wrapped(const ModulePtr& model) {
  auto wrapped = auto_wrap(model, {fixtures::kDemoNoSplitModule}, kFsdp2);
  wrapped = wrap(wrapped, "_orig_module.model.embed_tokens", "CheckpointWrapper");
  wrapped = wrap(wrapped, "_orig_module.model.embed_tokens", "OptimizedModule");
  wrapped = wrap(wrapped, "_orig_module.lm_head", "FullyShardedDataParallel");
  wrapped = wrap(wrapped, "_orig_module.model.layers.1._orig_module.mlp", "DataParallel");
  return wrap(wrapped, "", "DistributedDataParallel");
}

TEST(UnwrapReference, RemovesNestedWrappersAnywhere) {
  auto model = make_demo_model();
  const auto original = state_dict(model);
  auto wrapped = heavily_wrapped(model);
  ASSERT_NE(keys(state_dict(wrapped)), keys(original));

  const auto unwrapped = unwrap_reference(wrapped).state_dict();
  EXPECT_THAT(unwrapped, HasKeys(keys(original)));  // same length, same order
  EXPECT_TRUE(same_tensors(unwrapped, original));
  EXPECT_TRUE(wrapped_state(unwrap_reference(wrapped)).is_empty());
}

TEST(UnwrapReference, PreservesTies) {
  auto wrapped = heavily_wrapped(make_demo_model());
  const auto sd = unwrap_reference(wrapped).state_dict();
  EXPECT_TRUE(sd["lm_head.weight"].is_same(sd["model.embed_tokens.weight"]));
}

TEST(UnwrapReference, DoesNotMutateTheWrappedModel) {
  auto wrapped = heavily_wrapped(make_demo_model());
  const auto tree_before = format_tree(wrapped);
  const auto keys_before = keys(state_dict(wrapped));
  const auto out_before = call(*wrapped, tokens());

  (void)unwrap_reference(wrapped);

  EXPECT_EQ(format_tree(wrapped), tree_before);
  EXPECT_THAT(state_dict(wrapped), HasKeys(keys_before));
  auto wrappers = wrappers_in(wrapped);
  ASSERT_EQ(wrappers.size(), 8u);
  for (auto& w : wrappers) w->reset_calls();
  EXPECT_TRUE(call(*wrapped, tokens()).equal(out_before));
  for (auto& w : wrappers) EXPECT_EQ(w->calls(), 1) << w->kind_name();
}

TEST(UnwrapReference, IsIdentityOnUnwrappedModelAndIdempotent) {
  auto model = make_demo_model();
  const auto view = unwrap_reference(model);
  EXPECT_EQ(view.root().module, model);
  EXPECT_TRUE(same_tensors(view.state_dict(), state_dict(model)));
  EXPECT_EQ(format_tree(view), format_tree(model));

  auto wrapped = heavily_wrapped(model);
  auto once = unwrap_reference(wrapped);
  auto twice = unwrap_reference(once.root().module);
  EXPECT_THAT(twice.state_dict(), HasKeys(keys(once.state_dict())));
}

TEST(UnwrapReference, KeepsSharedSubmodulesShared) {
  auto shared = torch::nn::Linear(3, 3);
  auto root = std::make_shared<ChainImpl>();
  auto a = std::make_shared<ChainImpl>();
  auto b = std::make_shared<ChainImpl>();
  a->register_module("proj", shared);
  b->register_module("proj", shared);
  root->register_module("a", a);
  root->register_module("b", b);
  ModulePtr wrapped = wrap(root, "a.proj", "FullyShardedDataParallel");
  wrapped = wrap(wrapped, "b", "DataParallel");

  const auto view = unwrap_reference(wrapped);
  EXPECT_EQ(view.size(), 4u);  // root, a, b, proj: the shared module is one node
  const auto sd = view.state_dict();
  EXPECT_THAT(sd,
              HasKeys(ElementsAre("a.proj.weight", "a.proj.bias", "b.proj.weight", "b.proj.bias")));
  EXPECT_TRUE(sd["a.proj.weight"].is_same(sd["b.proj.weight"]));
}

TEST(UnwrapReference, RejectsACycleNamingThePath) {
  auto root = std::make_shared<ChainImpl>();
  auto inner = std::make_shared<ChainImpl>();
  root->register_module("inner", inner);
  auto wrapper = std::make_shared<DataParallelImpl>(root);  // DataParallel(root)
  inner->register_module("back", wrapper);                  // root.inner.back -> root again
  EXPECT_THAT([&] { (void)unwrap_reference(wrapper); },
              ThrowsError(ErrorCode::kCycle, "module.inner.back", HasSubstr("its own ancestor")));
  EXPECT_EQ(unwrap_legacy(wrapper), root) << "legacy only follows the root chain";
  inner->replace_module("back", torch::nn::Linear(1, 1));  // break the reference cycle
}

TEST(UnwrapReference, HandlesATenThousandDeepChain) {
  ModulePtr m = torch::nn::Linear(2, 2).ptr();
  auto leaf = m;
  const auto& kinds = Registry::global().kinds();
  for (int i = 0; i < 10000; ++i) m = kinds[i % kinds.size()].make(m);
  const auto view = unwrap_reference(m);
  EXPECT_EQ(view.root().module, leaf);
  EXPECT_THAT(view.state_dict(), HasKeys(ElementsAre("weight", "bias")));
  EXPECT_EQ(view.root_via().size(), 10000u);
  EXPECT_EQ(unwrap_legacy(m), leaf);
}

TEST(UnwrapReference, RejectsEmptySlotAndUndeclaredWrapperState) {
  auto wrapper = std::make_shared<DataParallelImpl>(torch::nn::Linear(2, 2).ptr());
  wrapper->register_parameter("stray", torch::zeros({1}));
  EXPECT_THAT([&] { (void)unwrap_reference(wrapper); },
              ThrowsError(ErrorCode::kWrapperState, "stray"));

  Registry registry = Registry::with_builtins();
  struct HollowImpl : ChainImpl {};
  registry.add(WrapperKind("Hollow", typeid(HollowImpl), "inner"));
  auto empty = std::make_shared<HollowImpl>();
  auto root = std::make_shared<ChainImpl>();
  root->register_module("w", empty);
  EXPECT_THAT([&] { (void)unwrap_reference(root, registry); },
              ThrowsError(ErrorCode::kEmptySlot, "w.inner"));  // the slot that is empty
}

TEST(UnwrapLegacy, LeavesInnerWrappers) {
  auto model = make_demo_model();
  const auto original = keys(state_dict(model));
  auto wrapped = auto_wrap(model, {fixtures::kDemoNoSplitModule}, kFsdp2);
  const auto view = unwrap(BuiltinUnwrap::kLegacy, wrapped);
  EXPECT_EQ(view.root().module, model);
  EXPECT_NE(keys(view.state_dict()), original);
  EXPECT_EQ(wrapped_state(view).size(), 2u * 9u);  // every key of both layers
  EXPECT_THAT(view.state_dict(),
              HasKeys(::testing::Contains("model.layers.0._orig_module.mlp.down_proj.weight")));
}

TEST(UnwrapLegacy, AgreesWithReferenceOnARootChain) {
  auto model = make_demo_model();
  ModulePtr wrapped = model;
  for (const char* kind : {"OptimizedModule", "DistributedDataParallel", kFsdp2, "DataParallel"}) {
    wrapped = wrap(wrapped, "", kind);
  }
  EXPECT_THAT(unwrap(BuiltinUnwrap::kLegacy, wrapped).state_dict(),
              HasKeys(keys(unwrap_reference(wrapped).state_dict())));
}

TEST(UnwrapDuckTyped, DropsTheSiblingsOfAUserChildNamedModule) {
  auto root = std::make_shared<ChainImpl>();
  root->register_module("norm", std::make_shared<UserModuleImpl>("module"));
  const auto original = keys(state_dict(root));
  ASSERT_THAT(original, ElementsAre("norm.scale", "norm.module.weight", "norm.module.bias",
                                    "norm.extra.weight", "norm.extra.bias"));

  // Reference: a user module is not a wrapper, whatever its children are called.
  EXPECT_THAT(unwrap_reference(root).state_dict(), HasKeys(original));
  // Duck-typed: `hasattr(norm, "module")` holds, so `norm` is replaced by its child and its
  // own `scale` and its `extra` child are silently gone (hazard 2).
  const auto duck = keys(unwrap(BuiltinUnwrap::kDuckTyped, root).state_dict());
  EXPECT_THAT(duck, ElementsAre("norm.weight", "norm.bias"));
}

TEST(UnwrapDuckTyped, MutatesTheLiveModel) {
  auto model = make_demo_model();
  auto wrapped = auto_wrap(model, {fixtures::kDemoNoSplitModule}, kFsdp2);
  auto wrappers = wrappers_in(wrapped);
  ASSERT_EQ(wrappers.size(), 3u);

  auto result = unwrap_duck_typed(wrapped);
  EXPECT_EQ(result, model);
  EXPECT_THAT(state_dict(result), HasKeys(keys(state_dict(make_demo_model()))));
  // The wrapped model lost its per-layer wrappers: training on it runs unsharded (hazard 3).
  for (auto& w : wrappers) w->reset_calls();
  (void)call(*wrapped, tokens());
  std::int64_t layer_wrapper_calls = 0;
  for (auto& w : wrappers) layer_wrapper_calls += w.get() != wrapped.get() ? w->calls() : 0;
  EXPECT_EQ(layer_wrapper_calls, 0);
  EXPECT_EQ(wrappers_in(wrapped).size(), 1u);
}

TEST(UnwrapDuckTyped, StopsAtPythonsRecursionLimit) {
  ModulePtr m = torch::nn::Linear(2, 2).ptr();
  for (int i = 0; i < 1500; ++i) m = std::make_shared<DataParallelImpl>(m);
  EXPECT_THAT([&] { (void)unwrap_duck_typed(m); }, ThrowsError(ErrorCode::kRecursionLimit));
}

TEST(BuiltinUnwrap, RoundTripsThroughItsName) {
  for (auto s : all_subjects()) EXPECT_EQ(subject_from_string(to_string(s)), s);
  EXPECT_THROW(subject_from_string("recursive"), Error);
}

TEST(ScopedUnwrap, RunsThroughNoWrapperAndRestoresExactly) {
  auto model = make_demo_model({}, /*seed=*/3);
  model->to(torch::kDouble);
  const auto expected = call(*model, tokens());
  auto wrapped = heavily_wrapped(model);
  const auto tree_before = format_tree(wrapped);
  auto wrappers = wrappers_in(wrapped);

  {
    ScopedUnwrap scope(wrapped);
    EXPECT_EQ(scope.root(), model);
    EXPECT_EQ(scope.rewired(), 5u);  // embed, lm_head, two layers, one mlp
    EXPECT_EQ(format_tree(scope.root()), format_tree(make_demo_model()));
    for (auto& w : wrappers) w->reset_calls();
    EXPECT_TRUE(call(*scope.root(), tokens()).equal(expected));
    for (auto& w : wrappers) EXPECT_EQ(w->calls(), 0) << w->kind_name();
  }

  EXPECT_EQ(format_tree(wrapped), tree_before);
  for (auto& w : wrappers) w->reset_calls();
  EXPECT_TRUE(call(*wrapped, tokens()).equal(expected));
  for (auto& w : wrappers) EXPECT_EQ(w->calls(), 1) << w->kind_name();
}

TEST(ScopedUnwrap, RestoresWhenLeftByException) {
  auto wrapped = heavily_wrapped(make_demo_model());
  const auto tree_before = format_tree(wrapped);
  try {
    ScopedUnwrap scope(wrapped);
    ASSERT_NE(format_tree(wrapped), tree_before);
    throw std::runtime_error("training step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(format_tree(wrapped), tree_before);
}

}  // namespace
}  // namespace wrapcert
