#include <wrapcert/detail/parameter_table.h>

#include <torch/nn/cloneable.h>

namespace wrapcert::detail {
/// Names the specialization below; nothing else.
struct TableAccessKey {};
}  // namespace wrapcert::detail

/// `torch::nn::Module` keeps its tables of children and buffers private and befriends every
/// `Cloneable<T>`: this specialization, for a type of wrapcert's own (so it can clash with
/// nothing), only reads them.
template <>
class torch::nn::Cloneable<wrapcert::detail::TableAccessKey> {
 public:
  static const wrapcert::detail::ChildTable& children(const torch::nn::Module& module) {
    return module.children_;
  }
  static const wrapcert::detail::TensorTable& parameters(const torch::nn::Module& module) {
    return module.parameters_;
  }
  static const wrapcert::detail::TensorTable& buffers(const torch::nn::Module& module) {
    return module.buffers_;
  }
};

namespace wrapcert::detail {
namespace {

using Tables = torch::nn::Cloneable<TableAccessKey>;

/// `parameters_` is protected in `torch::nn::Module`; a derived class may name it.
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, torch::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};
}  // namespace

const ChildTable& child_table(const torch::nn::Module& module) {
  return Tables::children(module);
}

const TensorTable& parameter_table(const torch::nn::Module& module) {
  return Tables::parameters(module);
}

const TensorTable& buffer_table(const torch::nn::Module& module) {
  return Tables::buffers(module);
}

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
