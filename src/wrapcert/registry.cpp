#include <wrapcert/error.h>
#include <wrapcert/registry.h>

#include <algorithm>

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

ModulePtr WrapperKind::alias_of(const torch::nn::Module& wrapper, const std::string& alias,
                                const std::string& path) const {
  ModulePtr result = alias_target ? alias_target(wrapper, alias) : find_child(wrapper, alias);
  if (!result && !alias_target) result = inner_of(wrapper, path);
  if (!result) {
    throw Error(ErrorCode::kEmptySlot, path, name + "'s alias '" + alias + "' reaches no module");
  }
  return result;
}

bool WrapperKind::owns(const std::string& state_name) const {
  return std::find(owned_state.begin(), owned_state.end(), state_name) != owned_state.end();
}

std::string KindRef::name() const {
  return mode ? kind->name + "[" + mode->name + "]" : kind->name;
}

ModulePtr KindRef::make(ModulePtr inner) const {
  return mode ? mode->make(std::move(inner)) : kind->make(std::move(inner));
}

Numerics KindRef::numerics() const {
  return mode ? mode->numerics : kind->numerics;
}

const AcrossRanks& KindRef::ranks() const {
  return mode && mode->ranks ? *mode->ranks : kind->ranks;
}

WrapperKind KindRef::descriptor() const {
  WrapperKind copy = *kind;
  if (mode) {
    copy.make = mode->make;
    copy.numerics = mode->numerics;
  }
  return copy;
}

void Registry::add(WrapperKind kind) {
  if (kind.name.empty() || kind.slot.empty()) {
    throw Error(ErrorCode::kInvalidArgument, kind.slot,
                "a wrapper kind needs a name and a slot (name '" + kind.name + "')");
  }
  if (kind.name.find_first_of("[]") != std::string::npos) {
    throw Error(
        ErrorCode::kInvalidArgument, kind.slot,
        "a wrapper kind's name cannot contain brackets ('" + kind.name + "'); they name its modes");
  }
  for (const auto& mode : kind.modes) {
    if (mode.name.empty() || mode.name.find_first_of("[]") != std::string::npos || !mode.make) {
      throw Error(ErrorCode::kInvalidArgument, kind.slot,
                  "wrapper kind '" + kind.name + "' has a mode without a name or a make ('" +
                      mode.name + "')");
    }
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

KindRef Registry::resolve(std::string_view name) const {
  const auto open = name.find('[');
  if (open == std::string_view::npos || name.back() != ']') return KindRef{&at(name), nullptr};
  const auto& kind = at(name.substr(0, open));
  const auto mode = name.substr(open + 1, name.size() - open - 2);
  for (const auto& m : kind.modes) {
    if (m.name == mode) return KindRef{&kind, &m};
  }
  throw Error(ErrorCode::kUnknownWrapper, "",
              "wrapper kind '" + kind.name + "' has no mode '" + std::string(mode) + "'");
}

std::vector<std::string> Registry::names_with_modes() const {
  std::vector<std::string> out;
  for (const auto& kind : kinds_) {
    out.push_back(kind.name);
    for (const auto& mode : kind.modes) {
      if (!mode.ranks_only) out.push_back(kind.name + "[" + mode.name + "]");
    }
  }
  return out;
}

std::vector<std::string> Registry::names_across_ranks() const {
  std::vector<std::string> out;
  for (const auto& kind : kinds_) {
    if (kind.ranks.certify) out.push_back(kind.name);
    for (const auto& mode : kind.modes) {
      if (mode.ranks ? mode.ranks->certify : kind.ranks.certify) {
        out.push_back(kind.name + "[" + mode.name + "]");
      }
    }
  }
  return out;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> names;
  names.reserve(kinds_.size());
  for (const auto& kind : kinds_) names.push_back(kind.name);
  return names;
}

ScopedRegistration::ScopedRegistration(const WrapperKind& kind) : saved_(Registry::global()) {
  if (!Registry::global().contains(kind.name)) Registry::global().add(kind);
}

ScopedRegistration::~ScopedRegistration() {
  Registry::global() = std::move(saved_);
}

}  // namespace wrapcert
