#include <wrapcert/test_support/trees.h>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>

namespace wrapcert::test_support {

ModulePtr wide_tree(size_t blocks, size_t width) {
  auto root = std::make_shared<torch::nn::Module>();
  const auto& ddp = Registry::global().at("DataParallel");
  for (size_t b = 0; b < blocks; ++b) {
    auto block = std::make_shared<torch::nn::Module>();
    for (size_t l = 0; l < width; ++l) {
      auto leaf = std::make_shared<torch::nn::Module>();
      leaf->register_parameter("w", torch::empty({1}, torch::TensorOptions().device(c10::kMeta)));
      block->register_module("l" + std::to_string(l), leaf);
    }
    root->register_module("b" + std::to_string(b), ddp.make(block));
  }
  return root;
}

}  // namespace wrapcert::test_support
