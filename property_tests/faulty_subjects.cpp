#include "faulty_subjects.h"

#include <wrapcert/detail/marks.h>
#include <wrapcert/registry.h>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <functional>

namespace wrapcert::faulty {
namespace {

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&m) ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&m) ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m);
}

/// A hand-rolled recursive unwrap that sees through a wrapper only when `unwrap_here` says so.
props::Unwrapped walk_unwrap(const ModulePtr& root,
                             const std::function<bool(const torch::nn::Module* parent,
                                                      int unwrapped_on_path)>& unwrap_here) {
  StateDict state;
  std::function<void(ModulePtr, const torch::nn::Module*, const std::string&, int)> visit =
      [&](ModulePtr m, const torch::nn::Module* parent, const std::string& prefix, int depth) {
        const auto& registry = Registry::global();
        while (const auto* kind = registry.find(*m)) {
          if (!unwrap_here(parent, depth)) break;
          m = kind->inner_of(*m, prefix);
          ++depth;
        }
        for (const auto& p : m->named_parameters(false)) {
          if (p.value().defined()) state.insert(prefix + p.key(), p.value());
        }
        for (const auto& b : m->named_buffers(false)) state.insert(prefix + b.key(), b.value());
        for (const auto& c : m->named_children()) {
          visit(c.value(), m.get(), prefix + c.key() + ".", depth);
        }
      };
  visit(root, nullptr, "", 0);
  return {root, std::move(state), nullptr};
}

props::Unwrapped reference(const ModulePtr& wrapped) {
  return props::subject(BuiltinUnwrap::kReference)(wrapped);
}

}  // namespace

props::UnwrapSubject skips_wrappers_in_containers() {
  return [](const ModulePtr& wrapped) {
    return walk_unwrap(wrapped, [](const torch::nn::Module* parent, int) {
      return parent == nullptr || !is_container(*parent);
    });
  };
}

props::UnwrapSubject stops_after_two_levels() {
  return [](const ModulePtr& wrapped) {
    return walk_unwrap(wrapped, [](const torch::nn::Module*, int depth) { return depth < 2; });
  };
}

props::UnwrapSubject copies_tensors() {
  return [](const ModulePtr& wrapped) {
    auto u = reference(wrapped);
    StateDict copies;
    for (const auto& item : u.state) copies.insert(item.key(), item.value().detach().clone());
    u.state = std::move(copies);
    return u;
  };
}

props::UnwrapSubject unties_weights() {
  return [](const ModulePtr& wrapped) {
    auto u = reference(wrapped);
    StateDict untied;
    std::set<const void*> seen;
    for (const auto& item : u.state) {
      const bool again = !seen.insert(item.value().unsafeGetTensorImpl()).second;
      untied.insert(item.key(), again ? item.value().detach().clone() : item.value());
    }
    u.state = std::move(untied);
    return u;
  };
}

props::UnwrapSubject mutates_input() {
  return [](const ModulePtr& wrapped) {
    auto state = unwrap_reference(wrapped).state_dict();
    auto root = unwrap_duck_typed(wrapped);  // and leaves the live model rewired
    return props::Unwrapped{root, std::move(state), nullptr};
  };
}

props::UnwrapSubject reorders_keys() {
  return [](const ModulePtr& wrapped) {
    auto u = reference(wrapped);
    std::vector<std::pair<std::string, torch::Tensor>> items;
    for (const auto& item : u.state) items.emplace_back(item.key(), item.value());
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    StateDict sorted;
    for (auto& [k, v] : items) sorted.insert(k, v);
    u.state = std::move(sorted);
    return u;
  };
}

props::UnwrapSubject drops_flat_restoration() {
  return [](const ModulePtr& wrapped) {
    auto u = reference(wrapped);
    // Which tensors a flat-parameter wrapper holds: a release that forgot to copy them back.
    std::set<const void*> held;
    auto view = unwrap_reference(wrapped);
    for (size_t i = 0; i < view.size(); ++i) {
      for (const auto& [name, t] : detail::held_parameters(*view.node(i).module)) {
        held.insert(t.unsafeGetTensorImpl());
      }
    }
    StateDict out;
    for (const auto& item : u.state) {
      out.insert(item.key(), held.count(item.value().unsafeGetTensorImpl())
                                 ? torch::zeros_like(item.value())
                                 : item.value());
    }
    u.state = std::move(out);
    return u;
  };
}

props::Translator substring_translator() {
  return [](const ModulePtr&) {
    return [](const std::string& key) {
      std::string out = key;
      for (const auto& kind : Registry::global().kinds()) {
        const std::string token = kind.slot + ".";
        for (auto at = out.find(token); at != std::string::npos; at = out.find(token)) {
          out.erase(at, token.size());
        }
      }
      return out;
    };
  };
}

}  // namespace wrapcert::faulty
