#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace wrapcert {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::HasSubstr;

/// A wrapper kind a framework author might add: their own type, their own slot.
class ShardedImpl : public WrapperImpl {
 public:
  explicit ShardedImpl(ModulePtr inner)
      : WrapperImpl("Sharded", "_sharded_module", std::move(inner)) {}
};

TEST(Registry, HoldsTheBuiltInKindsWithTheirRealSlots) {
  const auto& r = Registry::global();
  EXPECT_EQ(r.at("DistributedDataParallel").slot, "module");
  EXPECT_EQ(r.at("FullyShardedDataParallel").slot, "_fsdp_wrapped_module");
  EXPECT_EQ(r.at("SpmdFullyShardedDataParallel").slot, "_orig_module");
  EXPECT_THAT(r.at("SpmdFullyShardedDataParallel").aliases, ::testing::ElementsAre("module"));
  EXPECT_EQ(r.at("OptimizedModule").slot, "_orig_mod");
  EXPECT_EQ(r.at("CheckpointWrapper").slot, "_checkpoint_wrapped_module");
  EXPECT_EQ(Registry::with_builtins().kinds().size(), 8u);
}

TEST(Registry, RecognisesByTypeNotByChildName) {
  const auto& r = Registry::global();
  auto user = std::make_shared<test_support::UserModuleImpl>("module");
  EXPECT_EQ(r.find(*user), nullptr);
  auto dp = std::make_shared<DataParallelImpl>(user);
  ASSERT_NE(r.find(*dp), nullptr);
  EXPECT_EQ(r.find(*dp)->name, "DataParallel");
}

TEST(Registry, RejectsAKindRegisteredTwiceByNameOrType) {
  Registry r = Registry::with_builtins();
  r.add(wrapper_kind<ShardedImpl>("Sharded", "_sharded_module"));
  EXPECT_THROW(r.add(wrapper_kind<ShardedImpl>("Sharded", "_sharded_module")), Error);
  EXPECT_THAT([&] { r.add(wrapper_kind<ShardedImpl>("ShardedAgain", "_sharded_module")); },
              ThrowsError(ErrorCode::kDuplicateKind, _, HasSubstr("'Sharded'")));
}

TEST(Registry, UnwrapsAUserRegisteredKindOnlyWhereItIsRegistered) {
  Registry r = Registry::with_builtins();
  r.add(wrapper_kind<ShardedImpl>("Sharded", "_sharded_module"));
  auto root = std::make_shared<test_support::ChainImpl>();
  root->register_module("fc", torch::nn::Linear(2, 2));
  auto wrapped = wrap(root, "fc", "Sharded", r);
  EXPECT_THAT(keys(unwrap_reference(wrapped, r).state_dict()),
              ::testing::ElementsAre("fc.weight", "fc.bias"));
  // Unknown to the global registry, the same wrapper is an ordinary module there.
  EXPECT_THAT(keys(unwrap_reference(wrapped).state_dict()),
              ::testing::ElementsAre("fc._sharded_module.weight", "fc._sharded_module.bias"));
}

}  // namespace
}  // namespace wrapcert
