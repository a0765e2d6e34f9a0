#include <wrapcert/detail/builtin_modules.h>
#include <wrapcert/detail/path.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/layer.h>
#include <wrapcert/view.h>
#include <wrapcert/wrap.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <set>

namespace wrapcert {
namespace {

using detail::join_path;

/// Index of `name` in a list container ("3" -> 3), checked against the registry order.
size_t list_index(const torch::nn::Module& parent, const std::string& name) {
  size_t i = 0;
  for (const auto& item : parent.named_children()) {
    if (item.key() == name) return i;
    ++i;
  }
  throw Error(ErrorCode::kUnknownPath, name, "no child named '" + name + "'");
}

template <typename T>
bool try_any(const ModulePtr& module, torch::nn::AnyModule& out) {
  if (auto typed = std::dynamic_pointer_cast<T>(module)) {
    out = torch::nn::AnyModule(std::move(typed));
    return true;
  }
  return false;
}

/// `Sequential` calls its elements through `AnyModule`, which needs the static type.
torch::nn::AnyModule any_module(const ModulePtr& module, const std::string& name) {
  torch::nn::AnyModule any;
#define WRAPCERT_TRY_ANY(Impl) || try_any<Impl>(module, any)
  if (try_any<Layer>(module, any) WRAPCERT_FOR_EACH_BUILTIN_MODULE(WRAPCERT_TRY_ANY)) return any;
#undef WRAPCERT_TRY_ANY
  throw Error(ErrorCode::kInvalidArgument, name,
              "a Sequential element can only be replaced by a wrapcert::Layer or a LibTorch "
              "single-tensor module, not " +
                  module->name());
}

}  // namespace

ModulePtr module_at(const ModulePtr& root, std::string_view path) {
  if (!root) throw Error(ErrorCode::kInvalidArgument, std::string(path), "null root module");
  ModulePtr current = root;
  std::string walked;
  std::string_view part;
  for (detail::PathComponents components(path); !path.empty() && components.next(part);) {
    const std::string name(part);
    walked = join_path(walked, name);
    auto child = find_child(*current, name);
    if (!child) {
      throw Error(ErrorCode::kUnknownPath, walked,
                  "Submodule '" + name + "' is not defined in " + python_type_name(*current));
    }
    current = std::move(child);
  }
  return current;
}

void replace_child(torch::nn::Module& parent, const std::string& name, ModulePtr child) {
  const auto current = find_child(parent, name);
  if (current == child) return;  // like Python's setattr with the same object
  if (!current) {
    throw Error(ErrorCode::kUnknownPath, name,
                "Submodule '" + name + "' is not defined in " + python_type_name(parent));
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    *(list->begin() + static_cast<std::ptrdiff_t>(list_index(parent, name))) = child;
  } else if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    *(seq->begin() + static_cast<std::ptrdiff_t>(list_index(parent, name))) =
        any_module(child, name);
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    dict->update(std::vector<std::pair<std::string, ModulePtr>>{{name, child}});
    return;  // `update` replaces the registry entry too
  }
  parent.replace_module(name, std::move(child));
}

ModulePtr wrap(const ModulePtr& root, std::string_view path, const WrapperKind& kind) {
  auto target = module_at(root, path);
  if (!kind.make) {
    throw Error(ErrorCode::kInvalidArgument, std::string(path),
                "wrapper kind '" + kind.name + "' has no constructor (`make`)");
  }
  return replace_at(root, path, kind.make(target));
}

ModulePtr replace_at(const ModulePtr& root, std::string_view path, ModulePtr module) {
  if (path.empty()) return module;
  const auto [parent_path, name] = detail::split_last(path);
  replace_child(*module_at(root, parent_path), std::string(name), std::move(module));
  return root;
}

ModulePtr wrap(const ModulePtr& root, std::string_view path, std::string_view kind_name,
               const Registry& registry) {
  return wrap(root, path, registry.at(kind_name));
}

ModulePtr auto_wrap(const ModulePtr& root, const std::vector<std::string>& type_names,
                    const WrapperKind& kind, AutoWrapOptions options) {
  const std::set<std::string> wanted(type_names.begin(), type_names.end());
  std::set<std::string> seen;
  std::vector<std::string> targets;
  auto view = ModuleView::of(root);  // rejects cycles; one entry per path
  for (const auto& path : view.module_paths()) {
    if (path.empty()) continue;
    const auto name = python_type_name(*module_at(root, path));
    if (wanted.count(name)) {
      seen.insert(name);
      targets.push_back(path);
    }
  }
  for (const auto& name : wanted) {
    if (!seen.count(name)) {
      throw Error(ErrorCode::kInvalidArgument, "",
                  "auto-wrap found no module of class '" + name + "' to wrap");
    }
  }
  // Deepest first (reverse pre-order), so wrapping one target does not move another's path.
  for (auto it = targets.rbegin(); it != targets.rend(); ++it) wrap(root, *it, kind);
  return options.wrap_root ? wrap(root, "", kind) : root;
}

ModulePtr auto_wrap(const ModulePtr& root, const std::vector<std::string>& type_names,
                    std::string_view kind_name, AutoWrapOptions options, const Registry& registry) {
  return auto_wrap(root, type_names, registry.at(kind_name), options);
}

}  // namespace wrapcert
