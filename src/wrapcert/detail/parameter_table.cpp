#include <wrapcert/detail/parameter_table.h>

namespace wrapcert::detail {
namespace {
/// `parameters_` is protected in `torch::nn::Module`; a derived class may name it.
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, torch::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};
}  // namespace

torch::Tensor* find_parameter(torch::nn::Module& owner, const std::string& name) {
  return ParameterAccess::of(owner).find(name);
}

void erase_parameter(torch::nn::Module& owner, const std::string& name) {
  ParameterAccess::of(owner).erase(name);
}

void insert_parameter(torch::nn::Module& owner, const std::string& name,
                      const torch::Tensor& tensor) {
  auto& params = ParameterAccess::of(owner);
  if (auto* slot = params.find(name)) {
    *slot = tensor;
  } else {
    params.insert(name, tensor);
  }
}

}  // namespace wrapcert::detail
