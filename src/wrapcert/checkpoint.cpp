#include <wrapcert/checkpoint.h>
#include <wrapcert/detail/marks.h>
#include <wrapcert/layer.h>

#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <unordered_set>

namespace wrapcert {
namespace {

constexpr const char* kCheckpointed = "checkpointed";

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The module's parameters are inputs of the function, so that its output requires grad when
/// they do (even if the input does not) and backward returns their gradients.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               torch::nn::Module* module, at::TensorList params) {
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    variable_list saved{input};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    torch::NoGradGuard no_grad;
    return detail::call_direct(*module, input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    // saved_data holds IValues, which have no raw pointer: the module's address is an int.
    auto* module = reinterpret_cast<torch::nn::Module*>(  // NOLINT(performance-no-int-to-ptr)
        ctx->saved_data["module"].toInt());
    auto input = saved[0].detach().requires_grad_(saved[0].requires_grad());
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      output = detail::call_direct(*module, input);
    }
    // Differentiate with respect to whatever requires grad; the rest gets no gradient.
    variable_list wrt;
    std::vector<size_t> where;
    for (size_t i = 0; i < saved.size(); ++i) {
      const auto& t = i == 0 ? input : saved[i];
      if (t.requires_grad()) {
        wrt.push_back(t);
        where.push_back(i);
      }
    }
    variable_list grads(saved.size() + 1);  // input, module (not a tensor), params...
    if (!wrt.empty() && output.requires_grad()) {
      auto computed = torch::autograd::grad({output}, wrt, {grad_outputs[0]},
                                            /*retain_graph=*/false, /*create_graph=*/false,
                                            /*allow_unused=*/true);
      for (size_t k = 0; k < where.size(); ++k) {
        grads[where[k] == 0 ? 0 : where[k] + 1] = computed[k];
      }
    }
    return grads;
  }
};

}  // namespace

torch::Tensor checkpointed_call(torch::nn::Module& module, const torch::Tensor& input) {
  // Each tensor once: LibTorch lists a shared submodule's (or a tied) parameter under every
  // path, and a tensor passed twice would get its gradient twice.
  std::vector<torch::Tensor> params;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.defined() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  return CheckpointFunction::apply(input, &module, at::TensorList(params));
}

void checkpoint_in_place(const ModulePtr& module) {
  detail::add_mark(module, kCheckpointed);
}

bool is_checkpointed(const torch::nn::Module& module) {
  return detail::has_mark(module, kCheckpointed);
}

}  // namespace wrapcert
