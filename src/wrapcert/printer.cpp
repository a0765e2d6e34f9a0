#include <wrapcert/detail/python_names.h>
#include <wrapcert/layer.h>
#include <wrapcert/printer.h>

#include <algorithm>
#include <optional>
#include <ostream>
#include <sstream>
#include <unordered_map>

namespace wrapcert {
namespace {

/// Python's `torch.nn.modules.module._addindent`: indent every line but the first.
std::string add_indent(const std::string& text, size_t spaces) {
  std::string out;
  out.reserve(text.size());
  const std::string pad(spaces, ' ');
  for (char c : text) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

/// `torch.nn.Module.__repr__` (and `ModuleList.__repr__` when compressing).
std::string python_repr(const torch::nn::Module& module,
                        const std::vector<std::pair<std::string, const std::string*>>& children,
                        bool compress) {
  const std::string extra = python_extra_repr(module);
  std::vector<std::string> extra_lines;
  if (!extra.empty()) {
    std::istringstream lines(extra);
    for (std::string line; std::getline(lines, line);) extra_lines.push_back(line);
  }
  const std::string type = python_type_name(module);
  std::vector<std::string> child_lines;
  if (compress && type == "ModuleList") {
    for (size_t start = 0; start < children.size();) {
      size_t end = start;
      while (end + 1 < children.size() && *children[end + 1].second == *children[start].second) {
        ++end;
      }
      std::string label = "(" + std::to_string(start) + "): ";
      if (end != start) {
        label = "(" + std::to_string(start) + "-" + std::to_string(end) +
                "): " + std::to_string(end - start + 1) + " x ";
      }
      child_lines.push_back(add_indent(label + *children[start].second, 2));
      start = end + 1;
    }
  } else {
    for (const auto& [name, repr] : children) {
      child_lines.push_back("(" + name + "): " + add_indent(*repr, 2));
    }
  }
  std::string out = type + "(";
  if (extra_lines.size() == 1 && child_lines.empty()) {
    out += extra_lines.front();
  } else if (!extra_lines.empty() || !child_lines.empty()) {
    for (const auto* lines : {&extra_lines, &child_lines}) {
      for (const auto& line : *lines) out += "\n  " + line;
    }
    out += "\n";
  }
  return out + ")";
}

/// LibTorch's `Module::pretty_print_recursive`.
std::string libtorch_repr(const torch::nn::Module& module,
                          const std::vector<std::pair<std::string, const std::string*>>& children) {
  std::ostringstream out;
  module.pretty_print(out);
  if (!children.empty()) {
    out << "(\n";
    for (const auto& [name, repr] : children) {
      out << "  (" << name << "): " << add_indent(*repr, 2) << "\n";
    }
    out << ")";
  }
  return out.str();
}

}  // namespace

std::string format_tree(const ModuleView& view, const PrintOptions& options) {
  // A node prints the same wherever it is reached: compute each once, children first.
  std::vector<std::optional<std::string>> repr(view.size());
  std::vector<size_t> stack{0};
  while (!stack.empty()) {
    const size_t index = stack.back();
    if (repr[index]) {
      stack.pop_back();
      continue;
    }
    const auto& node = view.node(index);
    bool ready = true;
    for (const auto& edge : node.children) {
      if (!repr[edge.node]) {
        stack.push_back(edge.node);
        ready = false;
      }
    }
    if (!ready) continue;
    stack.pop_back();
    std::vector<std::pair<std::string, const std::string*>> children;
    children.reserve(node.children.size());
    for (const auto& edge : node.children)
      children.emplace_back(std::string(edge.name), &*repr[edge.node]);
    repr[index] = options.style == PrintStyle::kPython
                      ? python_repr(*node.module, children, options.compress_repeated)
                      : libtorch_repr(*node.module, children);
  }
  return *repr.front();
}

std::string format_tree(const ModulePtr& module, const PrintOptions& options) {
  return format_tree(ModuleView::of(module), options);
}

std::string format_keys(const StateDict& state) {
  size_t width = 0;
  for (const auto& item : state) width = std::max(width, item.key().size());
  std::unordered_map<const void*, size_t> storage_ids;
  std::ostringstream out;
  for (const auto& item : state) {
    const auto& t = item.value();
    const void* storage = t.storage().unsafeGetStorageImpl();
    const size_t id = storage_ids.emplace(storage, storage_ids.size()).first->second;
    out << item.key() << std::string(width - item.key().size() + 2, ' ') << "[";
    for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.size(d);
    out << "]  " << detail::python_dtype_name(t.scalar_type()) << "  #" << id << "\n";
  }
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const ModuleView& view) {
  return out << format_tree(view);
}

void PrintTo(const ModuleView& view, std::ostream* out) {
  *out << format_tree(view);
}

}  // namespace wrapcert
