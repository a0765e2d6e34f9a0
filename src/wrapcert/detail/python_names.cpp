#include <wrapcert/detail/python_names.h>

#include <c10/util/Type.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace wrapcert::detail {
namespace {

const char* py_bool(bool value) {
  return value ? "True" : "False";
}

std::string inplace_repr(bool inplace) {
  return inplace ? "inplace=True" : "";
}

}  // namespace

std::string short_type_name(const torch::nn::Module& module) {
  std::string name = c10::demangle(typeid(module).name());
  // Drop template arguments, then namespaces: `ns::FooImpl<...>` -> `FooImpl`.
  if (auto angle = name.find('<'); angle != std::string::npos) name.erase(angle);
  if (auto colon = name.rfind("::"); colon != std::string::npos) name.erase(0, colon + 2);
  constexpr std::string_view kImpl = "Impl";
  if (name.size() > kImpl.size() &&
      name.compare(name.size() - kImpl.size(), kImpl.size(), kImpl.data()) == 0) {
    name.erase(name.size() - kImpl.size());
  }
  return name;
}

std::string builtin_extra_repr(const torch::nn::Module& module) {
  using namespace torch::nn;  // NOLINT(google-build-using-namespace): local to this lookup
  std::ostringstream out;
  if (const auto* m = dynamic_cast<const LinearImpl*>(&module)) {
    out << "in_features=" << m->options.in_features()
        << ", out_features=" << m->options.out_features()
        << ", bias=" << py_bool(m->options.bias());
  } else if (const auto* m = dynamic_cast<const EmbeddingImpl*>(&module)) {
    const auto& o = m->options;
    out << o.num_embeddings() << ", " << o.embedding_dim();
    if (o.padding_idx()) out << ", padding_idx=" << *o.padding_idx();
    if (o.max_norm()) out << ", max_norm=" << python_float_repr(*o.max_norm());
    if (o.norm_type() != 2.0) out << ", norm_type=" << python_float_repr(o.norm_type());
    if (o.scale_grad_by_freq()) out << ", scale_grad_by_freq=True";
    if (o.sparse()) out << ", sparse=True";
  } else if (const auto* m = dynamic_cast<const LayerNormImpl*>(&module)) {
    const auto& shape = m->options.normalized_shape();
    out << "(";
    for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
    out << (shape.size() == 1 ? ",)" : ")") << ", eps=" << python_float_repr(m->options.eps())
        << ", elementwise_affine=" << py_bool(m->options.elementwise_affine());
  } else if (const auto* m = dynamic_cast<const DropoutImpl*>(&module)) {
    out << "p=" << python_float_repr(m->options.p())
        << ", inplace=" << py_bool(m->options.inplace());
  } else if (const auto* m = dynamic_cast<const ReLUImpl*>(&module)) {
    out << inplace_repr(m->options.inplace());
  } else if (const auto* m = dynamic_cast<const GELUImpl*>(&module)) {
    out << "approximate='" << m->options.approximate() << "'";
  }
  return out.str();
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e-05"
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const auto e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
             digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    out += exp_buf;
  }
  return out;
}

std::string python_dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::Double:
      return "float64";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Long:
      return "int64";
    case c10::ScalarType::Int:
      return "int32";
    case c10::ScalarType::Short:
      return "int16";
    case c10::ScalarType::Char:
      return "int8";
    case c10::ScalarType::Byte:
      return "uint8";
    case c10::ScalarType::Bool:
      return "bool";
    case c10::ScalarType::ComplexFloat:
      return "complex64";
    case c10::ScalarType::ComplexDouble:
      return "complex128";
    default:
      return c10::toString(type);
  }
}

}  // namespace wrapcert::detail
