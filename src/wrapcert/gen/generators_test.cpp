#include <wrapcert/gen/generators.h>

#include <rapidcheck.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

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

/// Draws `n` trees, each from its own random stream, at rapidcheck's default size.
std::vector<TreeSpec> draw(const GenOptions& options, int n) {
  std::vector<TreeSpec> out;
  const auto g = trees(options);
  for (int i = 0; i < n; ++i) {
    out.push_back(g(rc::Random(static_cast<uint64_t>(i) + 1), 100).value());
  }
  return out;
}

TEST(Trees, DrawWhatTrainingVaries) {
  GenOptions options;
  options.kinds = {"DataParallel"};
  std::set<int64_t> widths, batches;
  int frozen = 0, mode_leaves = 0, cloneable = 0, adam = 0;
  for (const auto& spec : draw(options, 300)) {
    widths.insert(spec.dim);
    batches.insert(spec.batch);
    const auto s = stats(spec);
    frozen += s.frozen > 0;
    mode_leaves += s.mode_leaves > 0;
    cloneable += s.cloneable > 0;
    adam += spec.optimizer == Optimizer::kAdam;
  }
  // Every width from 1 to 8 (so that 2, 3 and 4 ranks see even, uneven and empty shards) and
  // every batch size from 1 to 5.
  EXPECT_EQ(widths, (std::set<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(batches, (std::set<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_GT(frozen, 30);
  EXPECT_GT(mode_leaves, 30);
  EXPECT_GT(cloneable, 30);
  EXPECT_GT(adam, 30);
  EXPECT_LT(adam, 270);
}

TEST(Trees, LeaveTheTrainingLeavesOutWhenAsked) {
  GenOptions options;
  options.kinds = {"DataParallel"};
  options.training = false;
  std::set<int64_t> widths;
  for (const auto& spec : draw(options, 200)) {
    const auto s = stats(spec);
    EXPECT_EQ(s.frozen + s.mode_leaves + s.cloneable, 0) << describe(spec);
    widths.insert(spec.dim);
  }
  EXPECT_EQ(widths.size(), 8u) << "widths vary either way";
}

TEST(Describe, SaysTheWidthTheBatchAndWhatIsFrozen) {
  TreeSpec spec;
  spec.dim = 5;
  spec.batch = 4;
  spec.optimizer = Optimizer::kAdam;
  auto fc = NodeSpec::leaf_of(Leaf::kTorchLinear);
  fc.frozen = true;
  spec.root.children.push_back({"fc", fc});
  spec.root.children.push_back({"scale", NodeSpec::leaf_of(Leaf::kModeScale)});
  spec.root.children.push_back({"buffered", NodeSpec::leaf_of(Leaf::kBuffered)});
  const auto text = describe(spec);
  EXPECT_THAT(text, StartsWith("built in float64, 5 wide, run in training mode on a batch of 4, "
                               "trained with Adam\n"));
  // Parameters alone: a buffer is never trained, so never listed as frozen.
  EXPECT_THAT(text, HasSubstr("\nfrozen (requires_grad=False): fc.weight, fc.bias\n"));
  EXPECT_THAT(text, HasSubstr("(fc): Linear(in_features=5, out_features=5, bias=True)"));
  EXPECT_THAT(text, HasSubstr("(scale): ModeScale(eval_factor=0.5)"));
}

}  // namespace
}  // namespace wrapcert::gen
