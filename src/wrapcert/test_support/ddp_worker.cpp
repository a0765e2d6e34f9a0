// One rank of a data-parallel run, for the multi-process DistributedDataParallel test:
//   wrapcert_ddp_worker STORE_PATH RANK WORLD_SIZE OUT_FILE
// Trains one step of tiny Mistral on rank-specific tokens and saves the parameter gradients.

#include <wrapcert/distributed.h>
#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/test_support/ddp_batch.h>

#include <torch/serialize.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: wrapcert_ddp_worker STORE_PATH RANK WORLD_SIZE OUT_FILE\n";
    return 2;
  }
  try {
    const int rank = std::stoi(argv[2]);
    const int world = std::stoi(argv[3]);
    auto group = wrapcert::ProcessGroup::gloo(argv[1], rank, world);
    auto model = wrapcert::fixtures::make_causal_lm(wrapcert::fixtures::tiny_mistral(),
                                                    {c10::kCPU, c10::kDouble, /*seed=*/11});
    auto ddp = std::make_shared<wrapcert::DistributedDataParallelImpl>(model, group);
    wrapcert::test_support::ddp_loss(wrapcert::call(*ddp, wrapcert::test_support::ddp_batch(rank)))
        .backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    torch::save(grads, argv[4]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << argv[2] << ": " << e.what() << "\n";
    return 1;
  }
}
