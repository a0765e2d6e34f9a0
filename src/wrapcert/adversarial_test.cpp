// Adversarial graphs: each gives a correct result or an Error naming the key path; never a
// crash, a hang or a silently dropped key. Label `adversarial`; the figures for time and memory
// at these sizes come from bench/wrapcert_bench (BM_MillionModuleTree, BM_DeepChain).
#include <wrapcert/certify/properties.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/models.h>
#include <wrapcert/test_support/paths.h>
#include <wrapcert/test_support/trees.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace wrapcert {
namespace {

using test_support::HasKeys;
using test_support::ThrowsError;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModulePtr linear() {
  return torch::nn::Linear(torch::nn::LinearOptions(2, 2)).ptr();
}

TEST(Adversarial, ACycleThroughAWrapperIsAnErrorNamingThePath) {
  auto inner = std::make_shared<torch::nn::Module>();
  inner->register_module("proj", linear());
  auto wrapper = Registry::global().at("DataParallel").make(inner);
  auto block = std::make_shared<torch::nn::Module>();
  inner->register_module("block", block);
  block->register_module("back", wrapper);  // wrapper -> inner -> block -> wrapper

  EXPECT_THAT([&] { (void)unwrap_reference(wrapper); },
              ThrowsError(ErrorCode::kCycle, "module.block.back"));
  EXPECT_THAT([&] { (void)KeyTranslator::from_tree(wrapper); },
              ThrowsError(ErrorCode::kCycle, "module.block.back"));
  EXPECT_THAT([&] { (void)format_tree(wrapper); },
              ThrowsError(ErrorCode::kCycle, "module.block.back"));
  EXPECT_THAT([&] { (void)state_dict(wrapper); },
              ThrowsError(ErrorCode::kCycle, "module.block.back"));
  // The duck-typed subject recurses like Python and stops at Python's limit.
  EXPECT_THROW((void)unwrap_duck_typed(wrapper), Error);
  EXPECT_EQ(unwrap_legacy(wrapper), inner) << "legacy only follows the root chain";
  block->replace_module("back", linear());  // break the reference cycle (no leak)
}

TEST(Adversarial, ACycleThroughContainersIsAnErrorNamingThePath) {
  torch::nn::ModuleList outer;
  torch::nn::ModuleDict middle;
  torch::nn::ModuleList inner;
  inner->push_back(torch::nn::Linear(2, 2));
  middle->update(std::vector<std::pair<std::string, ModulePtr>>{{"inner", inner.ptr()}});
  outer->push_back(middle.ptr());
  inner->push_back(outer.ptr());  // outer.0.inner.1 is outer again

  EXPECT_THAT([&] { (void)unwrap_reference(outer.ptr()); },
              ThrowsError(ErrorCode::kCycle, "0.inner.1"));
  EXPECT_THAT([&] { (void)KeyTranslator::from_tree(outer.ptr()); },
              ThrowsError(ErrorCode::kCycle, "0.inner.1"));
  replace_child(*inner, "1", linear());  // break the cycle in both of ModuleList's lists
}

TEST(Adversarial, AHundredThousandDeepWrapperChainUnwrapsTranslatesAndIsReleased) {
  constexpr size_t kDepth = 100000;
  ModulePtr leaf = linear();
  ModulePtr m = leaf;
  const auto& kinds = Registry::global().kinds();
  for (size_t i = 0; i < kDepth; ++i) m = kinds[i % kinds.size()].make(m);
  std::string wrapped_prefix;  // the outermost wrapper's slot first
  for (size_t i = kDepth; i-- > 0;) wrapped_prefix += kinds[i % kinds.size()].slot + ".";
  {
    const auto view = unwrap_reference(m);
    EXPECT_EQ(view.root().module, leaf);
    EXPECT_EQ(view.root_via().size(), kDepth);
    EXPECT_THAT(view.state_dict(), HasKeys(keys(state_dict(leaf))));
    EXPECT_EQ(unwrap_legacy(m), leaf);
    EXPECT_THAT([&] { (void)unwrap_duck_typed(m); },
                ThrowsError(ErrorCode::kRecursionLimit, ::testing::StartsWith("module.")))
        << "the duck-typed subject must stop at Python's limit, not go 100,000 levels deep";

    const auto tr = KeyTranslator::from_tree(m);
    ASSERT_EQ(tr.size(), 2u);
    EXPECT_EQ(tr.to_clean(wrapped_prefix + "weight"), "weight");
    EXPECT_EQ(tr.to_wrapped("bias"), wrapped_prefix + "bias");
    EXPECT_TRUE(tr.to_wrapped("weight").size() > 5 * kDepth) << "every slot is spelled out";
  }
  release_tree(std::move(m));  // LibTorch's destructors would recurse 100,000 levels
  EXPECT_EQ(leaf.use_count(), 1) << "the chain is gone, the leaf is ours alone";
}

TEST(Adversarial, AMillionModuleTreeUnwrapsWithEveryKey) {
  constexpr size_t kBlocks = 1000, kWidth = 998;  // 1,000,001 modules
  auto tree = test_support::wide_tree(kBlocks, kWidth);
  const auto view = unwrap_reference(tree);
  EXPECT_EQ(view.size(), 1 + kBlocks * (kWidth + 1)) << "wrappers are seen through";
  const auto tr = KeyTranslator::from_tree(tree);
  ASSERT_EQ(tr.size(), kBlocks * kWidth);
  EXPECT_EQ(tr.pairs().front(),
            std::make_pair(std::string("b0.module.l0.w"), std::string("b0.l0.w")));
  EXPECT_EQ(tr.pairs().back(),
            std::make_pair(std::string("b999.module.l997.w"), std::string("b999.l997.w")));
  size_t leftovers = 0;
  for (const auto& [wrapped, clean] : tr.pairs()) {
    leftovers += clean.find(".module.") != std::string::npos;
  }
  EXPECT_EQ(leftovers, 0u);
  release_tree(std::move(tree));
}

TEST(Adversarial, AWrapperWithAnEmptySlotIsAnErrorNamingIt) {
  Registry registry = Registry::with_builtins();
  struct HollowImpl : torch::nn::Module {};
  registry.add(WrapperKind("Hollow", typeid(HollowImpl), "inner"));
  auto root = std::make_shared<torch::nn::Module>();
  auto layers = std::make_shared<torch::nn::Module>();
  root->register_module("layers", layers);
  layers->register_module("0", std::make_shared<HollowImpl>());
  EXPECT_THAT([&] { (void)unwrap_reference(root, registry); },
              ThrowsError(ErrorCode::kEmptySlot, "layers.0.inner",
                          HasSubstr("Hollow has no module in its slot")));
  EXPECT_THAT([&] { (void)KeyTranslator::from_tree(root, registry); },
              ThrowsError(ErrorCode::kEmptySlot, "layers.0.inner"));
}

TEST(Adversarial, AModuleReachedByAThousandPathsKeepsEveryKeyAndOneTensor) {
  auto shared = linear();
  torch::nn::ModuleList list;
  const auto& kinds = Registry::global().kinds();
  for (size_t i = 0; i < 1000; ++i) {
    list->push_back(i % 2 ? kinds[i % kinds.size()].make(shared) : shared);
  }
  const auto view = unwrap_reference(list.ptr());
  EXPECT_EQ(view.size(), 2u) << "the shared module is visited once";
  const auto state = view.state_dict();
  ASSERT_EQ(state.size(), 2000u) << "as PyTorch: its keys under every path";
  EXPECT_EQ(state.keys().front(), "0.weight");
  EXPECT_EQ(state.keys().back(), "999.bias");
  for (const auto& item : state) {
    EXPECT_TRUE(item.value().is_same(item.key().rfind(".weight") != std::string::npos
                                         ? shared->named_parameters()["weight"]
                                         : shared->named_parameters()["bias"]))
        << item.key();
  }
  // P3: the 1000 weight keys form one tie group in the wrapped tree and in the unwrapped one.
  EXPECT_EQ(props::tie_groups(state).size(), 2u);
  EXPECT_EQ(
      props::tie_groups(state),
      props::tie_groups(KeyTranslator::from_tree(list.ptr()).to_clean(state_dict(list.ptr()))));
}

/// Levels of two edges to one shared module: 2^levels paths to the bottom.
ModulePtr lattice(int levels) {
  ModulePtr bottom = linear();
  for (int i = 0; i < levels; ++i) {
    auto m = std::make_shared<torch::nn::Module>();
    m->register_module("left", bottom);
    m->register_module("right", Registry::global().at("OptimizedModule").make(bottom));
    bottom = m;
  }
  return bottom;
}

TEST(Adversarial, ALatticeWithExponentiallyManyPathsIsListedOrRefusedQuickly) {
  const auto small = lattice(10);  // 1,024 paths to the bottom
  const auto state = unwrap_reference(small).state_dict();
  EXPECT_EQ(state.size(), 2u * 1024u);
  std::string first;
  for (int i = 0; i < 10; ++i) first += "left.";
  EXPECT_EQ(state.keys().front(), first + "weight");

  const auto huge = lattice(60);             // 2^60 paths: listing them would never end
  const auto view = unwrap_reference(huge);  // the view itself is linear: 61 nodes
  EXPECT_EQ(view.size(), 61u);
  // Named: the first module reached by more paths than the limit (2^25 > 2^24).
  std::string bottom_path;
  for (int i = 0; i < 25; ++i) bottom_path += i ? ".left" : "left";
  EXPECT_THAT([&] { (void)view.state_dict(); }, ThrowsError(ErrorCode::kTooManyPaths, bottom_path,
                                                            HasSubstr("more than 16777216 paths")));
  EXPECT_THAT([&] { (void)KeyTranslator::from_tree(huge); },
              ThrowsError(ErrorCode::kTooManyPaths, bottom_path));
}

/// Wrapper kinds a framework author might add.
class FirstImpl : public WrapperImpl {
 public:
  explicit FirstImpl(ModulePtr inner) : WrapperImpl("First", "first_module", std::move(inner)) {}
};

TEST(Adversarial, TwoKindsClaimingOneTypeOrOneKindTwiceLeaveTheRegistryAsItWas) {
  Registry r = Registry::with_builtins();
  const auto before = r.names();
  r.add(wrapper_kind<FirstImpl>("First", "first_module"));
  // The same kind again, by name.
  EXPECT_THAT([&] { r.add(wrapper_kind<FirstImpl>("First", "first_module")); },
              ThrowsError(ErrorCode::kDuplicateKind, "first_module",
                          HasSubstr("'First' is already registered")));
  // Another kind claiming the same C++ type.
  EXPECT_THAT([&] { r.add(wrapper_kind<FirstImpl>("Second", "second_module")); },
              ThrowsError(ErrorCode::kDuplicateKind, "second_module",
                          HasSubstr("already registered as 'First'")));
  // A built-in name for a new type.
  EXPECT_THAT([&] { r.add(wrapper_kind<FirstImpl>("DataParallel", "module")); },
              ThrowsError(ErrorCode::kDuplicateKind, "module"));

  auto expected = before;
  expected.emplace_back("First");
  EXPECT_EQ(r.names(), expected) << "nothing half-registered";
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("layer", std::make_shared<FirstImpl>(linear()));
  EXPECT_THAT(unwrap_reference(model, r).state_dict(),
              HasKeys(ElementsAre("layer.weight", "layer.bias")));
}

nlohmann::json golden_dump(const std::string& name) {
  std::ifstream in(test_support::golden_dir() + "/torch_tree/" + name + ".json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(Adversarial, AnUnknownWrapperClassInAPythonDumpIsReportedNotDropped) {
  // A wrapper class the dump maps to a kind wrapcert does not have: an error naming the path.
  auto dump = golden_dump("dump_data_parallel");
  dump["wrappers"]["DataParallel"] = "DataParallelV9";
  EXPECT_THAT([&] { (void)bridge::load_tree_dump(dump.dump()); },
              ThrowsError(ErrorCode::kUnknownWrapper, "", HasSubstr("DataParallelV9")));

  // A wrapper class the dump does not declare: mirrored as a plain module, so its slot stays in
  // the keys and P1 fails naming the first leftover key (nothing is silently unwrapped).
  dump = golden_dump("dump_data_parallel");
  dump["nodes"][0]["class"] = "MyDataParallel";
  const auto verdicts = bridge::check_tree_dump(dump.dump());
  ASSERT_FALSE(verdicts.empty());
  EXPECT_EQ(verdicts[0].property, "P1 keys");
  EXPECT_FALSE(verdicts[0].passed);
  EXPECT_THAT(verdicts[0].key, ::testing::StartsWith("module."));
}

TEST(Adversarial, ADumpWithACycleOrADanglingChildIsAnErrorNamingThePath) {
  auto dump = golden_dump("dump_data_parallel");
  dump["nodes"][4]["children"][0][1] = 1;  // module.layers.0.proj is Net again
  EXPECT_THAT([&] { (void)bridge::load_tree_dump(dump.dump()); },
              ThrowsError(ErrorCode::kCycle, "module.layers.0.proj"));
  dump = golden_dump("dump_data_parallel");
  dump["nodes"][4]["children"][0][1] = 999;
  EXPECT_THAT([&] { (void)bridge::load_tree_dump(dump.dump()); },
              ThrowsError(ErrorCode::kMalformedInput, "module.layers.0.proj"));
  dump = golden_dump("dump_data_parallel");
  dump["nodes"][0]["children"] = nlohmann::json::array();  // DataParallel with an empty slot
  EXPECT_THAT([&] { (void)bridge::load_tree_dump(dump.dump()); },
              ThrowsError(ErrorCode::kWrapperState, ""));
}

TEST(Adversarial, ADumpDeeperThanTheStackLoads) {
  nlohmann::json dump = {{"root", 0}, {"wrappers", {{"DataParallel", "DataParallel"}}}};
  constexpr size_t kDepth = 100000;
  for (size_t i = 0; i < kDepth; ++i) {
    nlohmann::json node = {{"class", i % 2 ? "Block" : "DataParallel"},
                           {"params", nlohmann::json::array()},
                           {"buffers", nlohmann::json::array()}};
    node["children"] =
        nlohmann::json::array({nlohmann::json::array({i % 2 ? "inner" : "module", i + 1})});
    dump["nodes"].push_back(node);
  }
  dump["nodes"].push_back({{"class", "Linear"},
                           {"children", nlohmann::json::array()},
                           {"buffers", nlohmann::json::array()},
                           {"params", {{"weight", {2, 2}, "float32", 0}}}});
  auto mirror = bridge::load_tree_dump(dump.dump());
  const auto view = unwrap_reference(mirror);
  EXPECT_EQ(view.size(), kDepth / 2 + 1);
  release_tree(std::move(mirror));
}

}  // namespace
}  // namespace wrapcert
