#include <wrapcert/checkpoint.h>
#include <wrapcert/detail/blame.h>
#include <wrapcert/detail/builtin_modules.h>
#include <wrapcert/detail/marks.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/registry.h>

#include <torch/nn/modules/container/sequential.h>

#include <mutex>
#include <unordered_map>

namespace wrapcert {
namespace {

struct ForwardTable {
  std::mutex mutex;
  std::unordered_map<std::type_index, ForwardFn> fns;
};

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
    return t;
  }();
  return *t;
}

}  // namespace

std::string Layer::python_name() const {
  return detail::short_type_name(*this);
}

torch::Tensor Layer::parameter(const std::string& name) const {
  const auto params = named_parameters(/*recurse=*/false);
  if (const auto* found = params.find(name)) return *found;
  for (const auto& held : detail::held_parameters(*this)) {
    if (held.first == name) {
      throw Error(ErrorCode::kWrapperState, name,
                  "parameter '" + name + "' of " + python_name() +
                      " is held by a flat-parameter wrapper; run through the wrapper or release "
                      "it first");
    }
  }
  throw Error(ErrorCode::kUnknownKey, name,
              python_name() + " has no parameter named '" + name + "'");
}

torch::Tensor Layer::call_child(const std::string& name, const torch::Tensor& input) {
  auto child = find_child(*this, name);
  if (!child) {
    throw Error(ErrorCode::kUnknownPath, name,
                "Submodule '" + name + "' is not defined in " + detail::python_type_name(*this));
  }
  return call(*child, input);
}

torch::Tensor call(torch::nn::Module& module, const torch::Tensor& input) {
  try {
    if (is_checkpointed(module)) return checkpointed_call(module, input);
    return detail::call_direct(module, input);
  } catch (...) {
    const auto* kind = Registry::global().find(module);
    detail::note_blame(kind ? "the wrapper " + kind->name
                            : "the model's " + detail::python_type_name(module));
    throw;
  }
}

torch::Tensor detail::call_direct(torch::nn::Module& module, const torch::Tensor& input) {
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

void register_forward(std::type_index type, ForwardFn fn) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.fns[type] = std::move(fn);
}

}  // namespace wrapcert

namespace wrapcert {
namespace {
/// `parameters_` is protected in `torch::nn::Module`; a derived class may name it.
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, torch::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};
}  // namespace

void tie_parameter(torch::nn::Module& owner, const std::string& name, const torch::Tensor& tensor) {
  auto& params = ParameterAccess::of(owner);
  auto* slot = params.find(name);
  if (!slot) {
    throw Error(ErrorCode::kUnknownKey, name,
                detail::python_type_name(owner) + " has no parameter named '" + name + "'");
  }
  *slot = tensor;
}

void detail::erase_parameter(torch::nn::Module& owner, const std::string& name) {
  ParameterAccess::of(owner).erase(name);
}

void detail::insert_parameter(torch::nn::Module& owner, const std::string& name,
                              const torch::Tensor& tensor) {
  auto& params = ParameterAccess::of(owner);
  if (auto* slot = params.find(name)) {
    *slot = tensor;
  } else {
    params.insert(name, tensor);
  }
}

}  // namespace wrapcert
