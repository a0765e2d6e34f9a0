#include <wrapcert/gen/generators.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace wrapcert::gen {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(Describe, CountsTheTreeAsPrintedEachModuleOnce) {
  // A Sequential cannot hold an Embedding (the builder leaves it out), and a shared node is the
  // same module as `fc`: printed twice, counted once.
  TreeSpec spec;
  auto seq = NodeSpec::container_of(Container::kSequential);
  seq.children.push_back({"0", NodeSpec::leaf_of(Leaf::kLinear)});
  seq.children.push_back({"1", NodeSpec::leaf_of(Leaf::kEmbedding)});
  spec.root.children.push_back({"seq", seq});
  auto fc = NodeSpec::leaf_of(Leaf::kLinear);
  fc.wrappers = {"DataParallel", "OptimizedModule"};
  spec.root.children.push_back({"fc", fc});
  NodeSpec again;
  again.type = NodeSpec::Type::kShared;
  spec.root.children.push_back({"again", again});
  const auto text = describe(spec);
  EXPECT_THAT(text, Not(HasSubstr("Embedding")));
  // Block, Sequential, its Linear, fc's Linear; DataParallel and OptimizedModule.
  EXPECT_THAT(text, EndsWith("\n4 modules, 2 wrappers"));
  EXPECT_EQ(stats(spec).modules, 5) << "the spec itself counts the Embedding";
}

TEST(Describe, SaysInOneLineWhyASpecDoesNotBuild) {
  TreeSpec spec;
  auto fc = NodeSpec::leaf_of(Leaf::kLinear);
  fc.wrappers = {"FSDP3"};
  spec.root.children.push_back({"fc", fc});
  const auto text = describe(spec);
  EXPECT_THAT(text, StartsWith("<the spec does not build: "));
  EXPECT_THAT(text, HasSubstr("FSDP3"));
  EXPECT_THAT(text, Not(HasSubstr("\n")));
}

}  // namespace
}  // namespace wrapcert::gen
