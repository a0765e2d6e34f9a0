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

#include <optional>

namespace wrapcert::gen {

/// The LibTorch scalar type of `dtype`.
c10::ScalarType scalar_type(Dtype dtype);
/// Machine epsilon of `dtype` (2^-52 for double, 2^-7 for bfloat16).
double epsilon(Dtype dtype);

struct BuildOptions {
  /// What to build in; unset: the spec's `dtype`.
  std::optional<c10::ScalarType> dtype;
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
  /// The kind (or `Kind[mode]`) of each of `wrappers`, as the spec names it.
  std::vector<std::string> kinds;
  /// The largest tolerance its kinds declare (`Numerics::kTolerance`), in machine epsilons of
  /// the dtype compared; 0: bit for bit.
  double tolerance = 0.0;
  /// A kind in the tree changes outputs by design (`Numerics::kChangesOutput`).
  bool changes_output = false;
  /// A kind in the tree holds state its inner module needs to compute (`kNeedsRelease`): the
  /// wrapped model computes, the inner modules alone do not until released.
  bool needs_release = false;
};

Built build(const TreeSpec& spec, const BuildOptions& options = {});

/// A batch the built model accepts: (batch, dim) values in `dtype` (drawn in double, then
/// converted: the same values, rounded, in every dtype). A negative `batch`: the spec's.
torch::Tensor sample_input(const TreeSpec& spec, c10::ScalarType dtype, uint64_t seed = 0,
                           int64_t batch = -1);

}  // namespace wrapcert::gen
