#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <optional>

namespace wrapcert {
namespace {

using test_support::ChainImpl;
using test_support::ThrowsError;
using ::testing::ElementsAre;

/// A module with a parameter, a buffer and a child, in that registration order.
ModulePtr mixed() {
  auto root = std::make_shared<ChainImpl>();
  root->register_parameter("p", torch::zeros({1}));
  root->register_buffer("running", torch::zeros({1}));
  auto child = std::make_shared<ChainImpl>();
  child->register_buffer("inv_freq", torch::ones({2}));
  child->register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(2, 2).bias(false)));
  root->register_module("child", child);
  root->register_parameter("q", torch::zeros({1}));
  return root;
}

TEST(StateDict, FollowsPyTorchOrderAndSkipsUndefinedTensors) {
  EXPECT_THAT(keys(state_dict(mixed())),
              ElementsAre("p", "q", "running", "child.inv_freq", "child.fc.weight"));
}

TEST(StateDict, LeavesOutNonPersistentBuffers) {
  auto root = mixed();
  auto child = root->named_children()["child"];
  mark_non_persistent(child, "inv_freq");
  EXPECT_THAT(keys(state_dict(root)), ElementsAre("p", "q", "running", "child.fc.weight"));
  EXPECT_EQ(child->named_buffers().size(), 1u) << "the buffer itself stays registered";
  EXPECT_THAT([&] { mark_non_persistent(child, "nope"); }, ThrowsError(ErrorCode::kUnknownKey));
}

TEST(ModuleView, ListsEveryPathOfASharedModule) {
  auto shared = torch::nn::Linear(1, 1);
  auto root = std::make_shared<ChainImpl>();
  root->register_module("a", shared);
  root->register_module("b", shared);
  const auto view = ModuleView::of(root);
  EXPECT_EQ(view.size(), 2u);
  EXPECT_THAT(view.module_paths(), ElementsAre("", "a", "b"));
}

TEST(ModuleView, ReportsWhatIsStillWrapped) {
  auto root = std::make_shared<ChainImpl>();
  root->register_module("fc", torch::nn::Linear(1, 1));
  root->register_module("norm", std::make_shared<test_support::UserModuleImpl>("module", 1));
  auto wrapped = wrap(root, "fc", "DataParallel");
  EXPECT_THAT(keys(wrapped_state(ModuleView::of(wrapped))),
              ElementsAre("fc.module.weight", "fc.module.bias"));
  EXPECT_TRUE(wrapped_state(unwrap_reference(wrapped)).is_empty());
}

TEST(ModuleView, KeepsItsNamesAndSlotsWhenTheTreeChangesAfterwards) {
  // Names longer than a short string's inline room, under wrappers: what a view shows must be
  // its own copy, not the modules' keys (which move when a table grows, and go with a module).
  auto root = std::make_shared<ChainImpl>();
  root->register_module("post_attention_layernorm_of_a_long_name", torch::nn::Linear(1, 1));
  auto wrapped = wrap(root, "post_attention_layernorm_of_a_long_name", "DataParallel");
  auto copy = std::make_optional(unwrap_reference(wrapped));
  const ModuleView view = *copy;  // copies share what they show
  copy.reset();
  for (int i = 0; i < 64; ++i) {  // the table reallocates its keys several times
    root->register_module("added_later_with_a_long_name_" + std::to_string(i),
                          torch::nn::Linear(1, 1));
  }
  root->unregister_module("post_attention_layernorm_of_a_long_name");
  const auto& edge = view.root().children.at(0);
  EXPECT_EQ(edge.name, "post_attention_layernorm_of_a_long_name");
  EXPECT_THAT(edge.via, ElementsAre("module"));
  EXPECT_THAT(keys(view.state_dict()), ElementsAre("post_attention_layernorm_of_a_long_name.weight",
                                                   "post_attention_layernorm_of_a_long_name.bias"));
}

/// A wrapper whose kind finds its inner module by first viewing what its slot holds, as a kind
/// whose `inner` unwraps or inspects its module would: a walk started inside a walk.
class ViewingRelayImpl : public WrapperImpl {
 public:
  explicit ViewingRelayImpl(ModulePtr inner)
      : WrapperImpl("ViewingRelay", "_viewed_module", std::move(inner)) {}
};

TEST(ModuleView, AKindThatViewsItsModuleWhileTheWalkRunsLeavesTheWalkWhole) {
  // The walk keeps its working arrays between calls on a thread; a walk inside it must get its
  // own, or it would overwrite the outer walk's index and path.
  auto kind = wrapper_kind<ViewingRelayImpl>("ViewingRelay", "_viewed_module");
  size_t inner_walks = 0;
  kind.inner = [&inner_walks](const torch::nn::Module& wrapper) {
    auto held = find_child(wrapper, "_viewed_module");
    inner_walks += unwrap_reference(held).size() > 0;
    return held;
  };
  const ScopedRegistration registration(kind);
  ModulePtr root = std::make_shared<ChainImpl>();
  for (int block = 0; block < 6; ++block) {
    auto inner = std::make_shared<ChainImpl>();
    for (int leaf = 0; leaf < 5; ++leaf) {
      inner->register_module("fc" + std::to_string(leaf), torch::nn::Linear(2, 2));
    }
    root->register_module("block" + std::to_string(block), inner);
  }
  root->register_module("tied", root->named_children()["block2"]);  // shared: one node
  const auto expected = keys(state_dict(root));
  for (const char* path : {"block1", "block3.fc2", "block4.fc0", "block4"}) {
    root = wrap(root, path, kind);
  }
  const auto view = unwrap_reference(root);
  EXPECT_EQ(keys(view.state_dict()), expected);
  EXPECT_GT(inner_walks, 0u);
  // And again: the thread's arrays, left by the walk before, are cleared for the next.
  EXPECT_EQ(keys(unwrap_reference(root).state_dict()), expected);
}

}  // namespace
}  // namespace wrapcert
