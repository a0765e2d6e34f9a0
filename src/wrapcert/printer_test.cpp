#include <wrapcert/detail/python_names.h>
#include <wrapcert/fixtures/demo.h>
#include <wrapcert/wrapcert.h>

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <sstream>

namespace wrapcert {
namespace {

namespace nn = torch::nn;

/// Mirrors, in LibTorch, a module printed by PyTorch 2.x (see kPythonPrintout).
ModulePtr sample() {
  nn::ModuleList list;
  for (int i = 0; i < 3; ++i) list->push_back(nn::Linear(nn::LinearOptions(8, 8).bias(false)));
  list->push_back(nn::Dropout(0.1));
  nn::ModuleList outer(nn::Linear(4, 8), nn::ReLU(), nn::LayerNorm(nn::LayerNormOptions({8})));
  outer->push_back(list);
  outer->push_back(nn::Embedding(nn::EmbeddingOptions(10, 3).padding_idx(0)));
  outer->push_back(nn::GELU(nn::GELUOptions().approximate("tanh")));
  return outer.ptr();
}

// `print(model)` of the same model in PyTorch 2.1 (Python):
//   nn.ModuleList([nn.Linear(4, 8), nn.ReLU(), nn.LayerNorm(8),
//                  nn.ModuleList([nn.Linear(8, 8, bias=False) for _ in range(3)]
//                                + [nn.Dropout(0.1)]),
//                  nn.Embedding(10, 3, padding_idx=0), nn.GELU(approximate="tanh")])
constexpr const char* kPythonPrintout = R"(ModuleList(
  (0): Linear(in_features=4, out_features=8, bias=True)
  (1): ReLU()
  (2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)
  (3): ModuleList(
    (0-2): 3 x Linear(in_features=8, out_features=8, bias=False)
    (3): Dropout(p=0.1, inplace=False)
  )
  (4): Embedding(10, 3, padding_idx=0)
  (5): GELU(approximate='tanh')
))";

TEST(FormatTree, PythonStyleMatchesAPyTorchPrintout) {
  EXPECT_EQ(format_tree(sample()), kPythonPrintout);
}

TEST(FormatTree, PythonStyleWithoutCompressionListsEveryElement) {
  PrintOptions options;
  options.compress_repeated = false;
  const auto text = format_tree(sample(), options);
  EXPECT_NE(text.find("    (1): Linear(in_features=8, out_features=8, bias=False)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find(" x "), std::string::npos);
}

TEST(FormatTree, LibTorchStyleMatchesLibTorchsOwnPrinter) {
  PrintOptions options;
  options.style = PrintStyle::kLibTorch;
  auto demo = auto_wrap(fixtures::make_demo_model(), {fixtures::kDemoNoSplitModule},
                        "SpmdFullyShardedDataParallel");
  for (const ModulePtr& m : {sample(), demo}) {
    std::ostringstream expected;
    expected << *m;
    EXPECT_EQ(format_tree(m, options), expected.str());
  }
}

TEST(FormatTree, CompressesOnlyRunsOfIdenticalElements) {
  nn::ModuleList list(nn::Linear(2, 2), nn::Linear(2, 3), nn::Linear(2, 3), nn::Linear(2, 2));
  EXPECT_EQ(format_tree(list.ptr()), R"(ModuleList(
  (0): Linear(in_features=2, out_features=2, bias=True)
  (1-2): 2 x Linear(in_features=2, out_features=3, bias=True)
  (3): Linear(in_features=2, out_features=2, bias=True)
))");
}

/// The listing's line for `key`, with the column padding collapsed.
std::string listing_line(const std::string& listing, const std::string& key) {
  std::istringstream lines(listing);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string first, word, collapsed;
    words >> first;
    if (first != key) continue;
    collapsed = first;
    while (words >> word) collapsed += " " + word;
    return collapsed;
  }
  return "<no line for " + key + ">";
}

TEST(FormatKeys, GivesTiedTensorsOneStorageId) {
  const auto text = format_keys(state_dict(fixtures::make_demo_model()));
  EXPECT_EQ(listing_line(text, "model.embed_tokens.weight"),
            "model.embed_tokens.weight [16, 8] float32 #0");
  EXPECT_EQ(listing_line(text, "lm_head.weight"), "lm_head.weight [16, 8] float32 #0");
  EXPECT_EQ(listing_line(text, "model.norm.weight"), "model.norm.weight [8] float32 #19");
}

TEST(PythonFloatRepr, FollowsPythonsRules) {
  using detail::python_float_repr;
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(1e-6), "1e-06");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(100.0), "100.0");
  EXPECT_EQ(python_float_repr(123456.789), "123456.789");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
}

TEST(PythonTypeName, StripsNamespacesAndImpl) {
  EXPECT_EQ(python_type_name(*fixtures::make_demo_model()), "DemoForCausalLM");
  EXPECT_EQ(python_type_name(*nn::Linear(1, 1)), "Linear");
  EXPECT_EQ(
      python_type_name(*std::make_shared<FullyShardedDataParallelImpl>(nn::Linear(1, 1).ptr())),
      "FullyShardedDataParallel");
}

}  // namespace
}  // namespace wrapcert
