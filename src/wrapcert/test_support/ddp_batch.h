#pragma once
/// The data of the multi-process DistributedDataParallel test, shared by the worker and the
/// single-process reference: each rank gets its own tokens, the loss is the mean squared logit.
///
///   auto loss = ddp_loss(call(*model, ddp_batch(rank)));

#include <torch/torch.h>

namespace wrapcert::test_support {

inline torch::Tensor ddp_batch(int rank) {
  return torch::tensor({{1 + rank, 7, 3 * rank + 2, 40, 9 + 5 * rank}}, torch::kLong);
}

inline torch::Tensor ddp_loss(const torch::Tensor& logits) {
  return logits.pow(2).mean();
}

}  // namespace wrapcert::test_support
