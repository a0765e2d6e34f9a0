// Counterexamples the property suite shrank from real bugs, kept as literal specs.

#include <wrapcert/certify/properties.h>
#include <wrapcert/gen/build.h>

#include <gtest/gtest.h>

namespace wrapcert {
namespace {

using gen::Container;
using gen::Leaf;
using gen::NodeSpec;

// P4 found it: CheckpointWrapper passed a shared submodule's parameter to its autograd function
// once per path, so backward accumulated its gradient twice. Shrunk to:
//   CheckpointWrapper(
//     (_checkpoint_wrapped_module): Block(
//       (layer): RMSNorm()
//       (my_fsdp_wrapped_module): RMSNorm()    <- the same module as `layer`
//     )
//   )
TEST(ShrunkCounterexample, CheckpointWrapperAroundASharedSubmodule) {
  gen::TreeSpec spec;
  spec.root.wrappers = {"CheckpointWrapper"};
  spec.root.children.push_back({"layer", NodeSpec::leaf_of(Leaf::kRMSNorm)});
  NodeSpec shared;
  shared.type = NodeSpec::Type::kShared;
  spec.root.children.push_back({"my_fsdp_wrapped_module", shared});
  const auto verdict = props::backward(spec, props::subject(BuiltinUnwrap::kReference));
  EXPECT_TRUE(verdict.passed) << verdict.reason << " at " << verdict.key;
  EXPECT_FALSE(verdict.skipped);
}

}  // namespace
}  // namespace wrapcert
