#pragma once
/// What the training-loop property (P17) needs on one process and across ranks alike: the
/// parameters an optimizer is given, the optimizer that steps them, and every module's mode.

#include <wrapcert/gen/spec.h>
#include <wrapcert/wrappers.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace wrapcert::detail {

/// Each parameter once, in order: what `torch.optim.SGD(model.parameters())` is given (PyTorch's
/// `parameters()` leaves out repeats; LibTorch's lists a shared module's under every path, and
/// a tensor given twice would be stepped twice).
std::vector<torch::Tensor> unique_parameters(const ModulePtr& root);

/// An optimizer over a model's parameters, stepping a float64 master copy of each parameter of
/// another dtype and rounding it back into the parameter (as mixed-precision training keeps
/// float32 masters). The update then does not depend on how parameters are laid out: LibTorch's
/// CPU kernels compute an update such as `add_(x, alpha)` with a fused multiply-add in their
/// vectorised body and without one (bfloat16: rounding twice) in their tail, so one flat tensor
/// stepped whole and its pieces stepped one by one differ in the last bit; a float64 update
/// rounded to float32 or below hides that bit. LibTorch 1.13 also has no float16 CPU kernel for
/// Adam's `addcmul`. Float64 parameters are stepped as they are.
class Trainer {
 public:
  Trainer(gen::Optimizer kind, std::vector<torch::Tensor> params);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  void step();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;  ///< float64 copies of the others
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// The first module under `root` (wrappers included, `root` itself as "") whose training flag
/// is not `training`, with why: what `model.eval()` and `model.train()` promise of every module.
std::optional<std::pair<std::string, std::string>> mode_difference(const ModulePtr& root,
                                                                   bool training);

/// Whether every element of `t` is finite (an undefined tensor is).
bool finite(const torch::Tensor& t);

}  // namespace wrapcert::detail
