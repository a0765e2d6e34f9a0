#include <wrapcert/fixtures/demo.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

namespace wrapcert {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::HasSubstr;

std::shared_ptr<WrapperImpl> as_wrapper(const ModulePtr& m) {
  return std::dynamic_pointer_cast<WrapperImpl>(m);
}

TEST(ReplaceModule, AloneLeavesTheOldChildOnTheForwardPath) {
  // The LibTorch quirk that `replace_child` exists for: Sequential keeps its own list.
  torch::nn::Sequential seq(torch::nn::Linear(2, 2));
  auto wrapper = std::make_shared<DataParallelImpl>(seq->ptr(0));
  seq->replace_module("0", wrapper);
  (void)seq->forward(torch::ones({1, 2}));
  EXPECT_EQ(wrapper->calls(), 0);
}

TEST(Wrap, PutsASequentialElementOnTheForwardPath) {
  torch::nn::Sequential seq(torch::nn::Linear(2, 3), torch::nn::ReLU(), torch::nn::Linear(3, 1));
  const auto expected = seq->forward(torch::ones({1, 2}));
  wrap(seq.ptr(), "2", "FullyShardedDataParallel");
  auto w = as_wrapper(seq->named_children()["2"]);
  ASSERT_TRUE(w);
  EXPECT_TRUE(seq->forward(torch::ones({1, 2})).equal(expected));
  EXPECT_EQ(w->calls(), 1);
  EXPECT_EQ(keys(state_dict(seq.ptr()))[2], "2._fsdp_wrapped_module.weight");
}

TEST(Wrap, PutsAModuleListElementOnTheForwardPath) {
  torch::nn::ModuleList list(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
  wrap(list.ptr(), "1", "CheckpointWrapper");
  int wrapper_calls = 0;
  for (const auto& m : *list) {  // iterates the list's own copy
    (void)call(*m, torch::ones({1, 2}));
    if (auto w = as_wrapper(m)) wrapper_calls += static_cast<int>(w->calls());
  }
  EXPECT_EQ(wrapper_calls, 1);
  EXPECT_EQ(list->ptr(1), list->named_children()["1"]);
}

TEST(Wrap, PutsAModuleDictElementOnTheForwardPath) {
  torch::nn::ModuleDict dict(std::vector<std::pair<std::string, ModulePtr>>{
      {"a", torch::nn::Linear(2, 2).ptr()}, {"b", torch::nn::Linear(2, 2).ptr()}});
  wrap(dict.ptr(), "a", "OptimizedModule");
  EXPECT_EQ(dict["a"], dict->named_children()["a"]);
  EXPECT_TRUE(as_wrapper(dict["a"]));
  EXPECT_EQ(dict->keys(), (std::vector<std::string>{"a", "b"}));  // order kept
}

TEST(Wrap, PutsACustomModulesChildOnTheForwardPath) {
  auto model = fixtures::make_demo_model();
  const auto tokens = torch::tensor({{1, 2, 3}}, torch::kLong);
  const auto expected = call(*model, tokens);
  wrap(model, "model.layers.0.mlp", "DeepSpeedEngine");
  auto w = as_wrapper(module_at(model, "model.layers.0.mlp"));
  ASSERT_TRUE(w);
  EXPECT_TRUE(call(*model, tokens).equal(expected));
  EXPECT_EQ(w->calls(), 1);
}

TEST(Wrap, AtTheRootReturnsTheWrapper) {
  auto model = fixtures::make_demo_model();
  auto wrapped = wrap(model, "", "DataParallel");
  EXPECT_EQ(as_wrapper(wrapped)->inner(), model);
  EXPECT_EQ(keys(state_dict(wrapped)).front(), "module.model.embed_tokens.weight");
}

TEST(AutoWrap, WrapsEveryLayerAndTheRootAndAllRun) {
  fixtures::DemoConfig config;
  config.layers = 4;
  auto wrapped = auto_wrap(fixtures::make_demo_model(config), {fixtures::kDemoNoSplitModule},
                           "SpmdFullyShardedDataParallel");
  auto view = ModuleView::of(wrapped);
  std::vector<std::shared_ptr<WrapperImpl>> wrappers;
  for (size_t i = 0; i < view.size(); ++i) {
    if (auto w = as_wrapper(view.node(i).module)) wrappers.push_back(w);
  }
  ASSERT_EQ(wrappers.size(), 5u);
  (void)call(*wrapped, torch::tensor({{1, 2}}, torch::kLong));
  for (const auto& w : wrappers) EXPECT_EQ(w->calls(), 1);
}

TEST(AutoWrap, RejectsAClassNameThatMatchesNothing) {
  EXPECT_THAT(
      [] { (void)auto_wrap(fixtures::make_demo_model(), {"GemmaDecoderLayer"}, "DataParallel"); },
      ThrowsError(ErrorCode::kInvalidArgument, _, HasSubstr("GemmaDecoderLayer")));
}

TEST(Wrap, NamesTheMissingPathComponent) {
  EXPECT_THAT([] { (void)wrap(fixtures::make_demo_model(), "model.layers.7.mlp", "DataParallel"); },
              ThrowsError(ErrorCode::kUnknownPath, "model.layers.7"));
}

TEST(Wrap, NamesTheKnownKindsForAnUnknownOne) {
  EXPECT_THAT(
      [] { (void)wrap(fixtures::make_demo_model(), "", "FSDP3"); },
      ThrowsError(ErrorCode::kUnknownWrapper, _, HasSubstr("SpmdFullyShardedDataParallel")));
}

TEST(Call, RejectsAModuleItCannotRun) {
  struct OpaqueImpl : torch::nn::Module {};
  auto opaque = std::make_shared<OpaqueImpl>();
  EXPECT_THROW((void)call(*opaque, torch::ones({1})), Error);
}

TEST(TieParameter, SharesOneTensorUnderBothKeys) {
  auto model = fixtures::make_demo_model();
  const auto sd = state_dict(model);
  EXPECT_TRUE(sd["lm_head.weight"].is_same(sd["model.embed_tokens.weight"]));
  EXPECT_THROW(tie_parameter(*model, "nope", torch::ones({1})), Error);
}

}  // namespace
}  // namespace wrapcert
