#pragma once
/// Builds fresh modules from a spec: the plain model, then its wrappers.
///
///   auto built = wrapcert::gen::build(spec, {torch::kDouble, /*seed=*/1});
///   built.root;      // the wrapped model
///   built.original;  // the model's state dict taken before wrapping (the very tensors)

#include <wrapcert/gen/spec.h>
#include <wrapcert/registry.h>
#include <wrapcert/view.h>
#include <wrapcert/wrappers.h>

namespace wrapcert::gen {

struct BuildOptions {
  c10::ScalarType dtype = c10::kDouble;
  uint64_t seed = 0;
  /// Apply the spec's wrappers; false gives the plain model.
  bool wrap = true;
};

struct Built {
  ModulePtr root;
  /// The plain model's state dict, captured before wrapping: the tensors a correct unwrap
  /// must give back.
  StateDict original;
  /// Every wrapper put in, outermost of each stack last.
  std::vector<std::shared_ptr<WrapperImpl>> wrappers;
  /// Every wrapper kind in the tree computes like its inner module: bit for bit, or within
  /// `tolerance` (the largest of its kinds').
  bool bitwise = true;
  double tolerance = 0.0;
};

Built build(const TreeSpec& spec, const BuildOptions& options = {});

/// A batch the built model accepts: (batch, dim) values in `dtype`.
torch::Tensor sample_input(const TreeSpec& spec, c10::ScalarType dtype, uint64_t seed = 0,
                           int64_t batch = 2);

}  // namespace wrapcert::gen
