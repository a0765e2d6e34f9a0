#pragma once
/// How PyTorch (Python) names things: class names, `extra_repr`, float repr, dtypes.
///
///   short_type_name(*torch::nn::Linear(4, 4))     // "Linear"
///   builtin_extra_repr(*torch::nn::Linear(4, 4))  // "in_features=4, out_features=4, bias=True"

#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <string>

namespace wrapcert::detail {

/// PyTorch's `extra_repr()` for LibTorch built-ins (`in_features=4, ...`); empty otherwise.
/// `wrapcert::python_extra_repr` (layer.h) adds `Layer`s.
std::string builtin_extra_repr(const torch::nn::Module& module);
/// The C++ type name without namespaces and without an `Impl` suffix: `Linear` for
/// `torch::nn::LinearImpl`, `GemmaDecoderLayer` for `fixtures::GemmaDecoderLayerImpl`.
std::string short_type_name(const torch::nn::Module& module);
/// Python's `repr(float)`: shortest round-trip digits, `1e-05`, `0.0001`, `1.0`.
std::string python_float_repr(double value);
/// `float32`, `bfloat16`, `int64`: the name after `torch.`.
std::string python_dtype_name(c10::ScalarType type);

}  // namespace wrapcert::detail
