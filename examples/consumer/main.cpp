// Wraps a LibTorch model the way a training framework would, then shows what each unwrap gives.
#include <wrapcert/wrapcert.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Linear(8, 2));
  auto wrapped = wrapcert::wrap(model.ptr(), "1", "FullyShardedDataParallel");
  wrapped = wrapcert::wrap(wrapped, "", "DistributedDataParallel");

  std::cout << wrapcert::format_tree(wrapped) << "\n\n";
  for (auto subject : wrapcert::all_subjects()) {
    const auto view = wrapcert::unwrap(subject, wrapped);
    std::cout << wrapcert::to_string(subject) << ":\n" << wrapcert::format_keys(view.state_dict());
  }
  return 0;
}
