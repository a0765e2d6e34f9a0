#include <wrapcert/error.h>
#include <wrapcert/registry.h>
#include <wrapcert/wrappers.h>

namespace wrapcert {

ModulePtr find_child(const torch::nn::Module& module, const std::string& name) {
  const auto children = module.named_children();
  const auto* found = children.find(name);
  return found ? *found : nullptr;
}

ModulePtr WrapperKind::inner_of(const torch::nn::Module& wrapper, const std::string& path) const {
  ModulePtr result = inner ? inner(wrapper) : find_child(wrapper, slot);
  if (!result) {
    throw Error(ErrorCode::kEmptySlot, path, name + " has no module in its slot '" + slot + "'");
  }
  return result;
}

Registry& Registry::global() {
  static Registry registry = with_builtins();
  return registry;
}

Registry Registry::with_builtins() {
  Registry registry;
  register_builtin_wrappers(registry);
  return registry;
}

void Registry::add(WrapperKind kind) {
  if (kind.name.empty() || kind.slot.empty()) {
    throw Error(ErrorCode::kInvalidArgument, kind.slot,
                "a wrapper kind needs a name and a slot (name '" + kind.name + "')");
  }
  if (by_name_.count(kind.name) != 0) {
    throw Error(ErrorCode::kDuplicateKind, kind.slot,
                "wrapper kind '" + kind.name + "' is already registered");
  }
  if (auto it = by_type_.find(kind.type); it != by_type_.end()) {
    throw Error(ErrorCode::kDuplicateKind, kind.slot,
                "type of wrapper kind '" + kind.name + "' is already registered as '" +
                    kinds_[it->second].name + "'");
  }
  by_name_.emplace(kind.name, kinds_.size());
  by_type_.emplace(kind.type, kinds_.size());
  kinds_.push_back(std::move(kind));
}

const WrapperKind* Registry::find(const torch::nn::Module& module) const {
  auto it = by_type_.find(typeid(module));
  return it == by_type_.end() ? nullptr : &kinds_[it->second];
}

bool Registry::contains(std::string_view name) const {
  return by_name_.count(std::string(name)) != 0;
}

const WrapperKind& Registry::at(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) {
    std::string known;
    for (const auto& kind : kinds_) {
      known += known.empty() ? "" : ", ";
      known += kind.name;
    }
    throw Error(ErrorCode::kUnknownWrapper, "",
                "no wrapper kind named '" + std::string(name) + "' (known: " + known + ")");
  }
  return kinds_[it->second];
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> names;
  names.reserve(kinds_.size());
  for (const auto& kind : kinds_) names.push_back(kind.name);
  return names;
}

}  // namespace wrapcert
