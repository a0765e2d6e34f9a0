#pragma once
/// The LibTorch built-in modules wrapcert can call with one tensor, in one list, so that
/// `call` and the `Sequential` rewiring in `replace_child` agree on what they support.
/// (`Sequential` itself is callable but cannot sit in an `AnyModule`: its forward is a template.)
///
///   #define ADD(Impl) table.add<Impl>();
///   WRAPCERT_FOR_EACH_BUILTIN_MODULE(ADD)

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#define WRAPCERT_FOR_EACH_BUILTIN_MODULE(X) \
  X(torch::nn::LinearImpl)                  \
  X(torch::nn::EmbeddingImpl)               \
  X(torch::nn::LayerNormImpl)               \
  X(torch::nn::IdentityImpl)                \
  X(torch::nn::DropoutImpl)                 \
  X(torch::nn::ReLUImpl)                    \
  X(torch::nn::GELUImpl)                    \
  X(torch::nn::SiLUImpl)                    \
  X(torch::nn::TanhImpl)
