#include <wrapcert/detail/blame.h>
#include <wrapcert/detail/builtin_modules.h>
#include <wrapcert/detail/marks.h>
#include <wrapcert/detail/parameter_table.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/registry.h>

#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

constexpr const char* kCheckpointed = "checkpointed";

struct ForwardTable {
  std::mutex mutex;
  std::unordered_map<std::type_index, ForwardFn> fns;
};

torch::Tensor linear_from_registry(torch::nn::Module& module, const torch::Tensor& x);

ForwardTable& table() {
  static ForwardTable* t = [] {
    auto* t = new ForwardTable;  // never destroyed: safe to use from static destructors
#define WRAPCERT_ADD_FORWARD(Impl)                                                                 \
  t->fns.emplace(std::type_index(typeid(Impl)), [](torch::nn::Module& m, const torch::Tensor& x) { \
    return dynamic_cast<Impl&>(m).forward(x); /* NOLINT(bugprone-macro-parentheses): a type */     \
  });
    WRAPCERT_FOR_EACH_BUILTIN_MODULE(WRAPCERT_ADD_FORWARD)
    WRAPCERT_ADD_FORWARD(torch::nn::SequentialImpl)
#undef WRAPCERT_ADD_FORWARD
    t->fns[std::type_index(typeid(torch::nn::LinearImpl))] = linear_from_registry;
    return t;
  }();
  return *t;
}

/// The parameter `name` registered on `module` now. Throws `Error`: kWrapperState when a
/// flat-parameter wrapper holds it, kUnknownKey when there is none.
torch::Tensor registered_parameter(const torch::nn::Module& module, const std::string& name,
                                   const std::string& who) {
  const auto params = module.named_parameters(/*recurse=*/false);
  if (const auto* found = params.find(name)) return *found;
  for (const auto& held : detail::held_parameters(module)) {
    if (held.first == name) {
      throw Error(ErrorCode::kWrapperState, name,
                  "parameter '" + name + "' of " + who +
                      " is held by a flat-parameter wrapper; run through the wrapper or release "
                      "it first");
    }
  }
  throw Error(ErrorCode::kUnknownKey, name, who + " has no parameter named '" + name + "'");
}

/// LibTorch's `Linear` run as Python runs `nn.Linear`: `self.weight` and `self.bias` read from
/// the registry at call time (a flat-parameter wrapper's views, a tied tensor), not from the
/// members its C++ forward reads. On the CPU, float16 computes in float32 and rounds back, as
/// autocast would: LibTorch 1.13 has no CPU kernel for a float16 matrix product.
torch::Tensor linear_from_registry(torch::nn::Module& module, const torch::Tensor& x) {
  const auto w = registered_parameter(module, "weight", "Linear");
  const auto params = module.named_parameters(/*recurse=*/false);
  const auto* found = params.find("bias");
  const auto b = found ? *found : torch::Tensor();
  if (w.scalar_type() != torch::kHalf || !w.device().is_cpu()) return at::linear(x, w, b);
  const auto up = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
  return at::linear(up(x), up(w), up(b)).to(torch::kHalf);
}

/// `call` without the checkpointing check (what a checkpointed run calls inside).
torch::Tensor call_direct(torch::nn::Module& module, const torch::Tensor& input);

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
    // A tensor of this node's own: were the output one the module keeps (a cache) or its input,
    // autograd would make this node its producer, and the recomputation in backward would
    // differentiate through this very node, waiting on the lock it holds.
    return call_direct(*module, input).clone();
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
      output = call_direct(*module, input);
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

std::string Layer::python_name() const {
  return detail::short_type_name(*this);
}

torch::Tensor Layer::parameter(const std::string& name) const {
  return registered_parameter(*this, name, python_name());
}

torch::Tensor Layer::call_child(const std::string& name, const torch::Tensor& input) {
  auto child = find_child(*this, name);
  if (!child) {
    throw Error(ErrorCode::kUnknownPath, name,
                "Submodule '" + name + "' is not defined in " + python_type_name(*this));
  }
  return call(*child, input);
}

torch::Tensor call(torch::nn::Module& module, const torch::Tensor& input) {
  try {
    if (is_checkpointed(module)) return checkpointed_call(module, input);
    return call_direct(module, input);
  } catch (...) {
    const auto* kind = Registry::global().find(module);
    detail::note_blame(kind ? "the wrapper " + kind->name
                            : "the model's " + python_type_name(module));
    throw;
  }
}

namespace {

torch::Tensor call_direct(torch::nn::Module& module, const torch::Tensor& input) {
  if (auto* layer = dynamic_cast<Layer*>(&module)) return layer->forward(input);
  ForwardFn fn;
  {
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.fns.find(typeid(module));
    if (it != t.fns.end()) fn = it->second;
  }
  if (!fn) {
    throw Error(ErrorCode::kNotForwardable, "",
                "no forward registered for " + module.name() +
                    " (derive from wrapcert::Layer or call wrapcert::register_forward)");
  }
  return fn(module, input);
}

}  // namespace

void register_forward(std::type_index type, ForwardFn fn) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.fns[type] = std::move(fn);
}

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

std::string python_type_name(const torch::nn::Module& module) {
  if (const auto* layer = dynamic_cast<const Layer*>(&module)) return layer->python_name();
  return detail::short_type_name(module);
}

std::string python_extra_repr(const torch::nn::Module& module) {
  if (const auto* layer = dynamic_cast<const Layer*>(&module)) return layer->extra_repr();
  return detail::builtin_extra_repr(module);
}

void tie_parameter(torch::nn::Module& owner, const std::string& name, const torch::Tensor& tensor) {
  auto* slot = detail::find_parameter(owner, name);
  if (!slot) {
    throw Error(ErrorCode::kUnknownKey, name,
                python_type_name(owner) + " has no parameter named '" + name + "'");
  }
  *slot = tensor;
}

}  // namespace wrapcert
