#include <wrapcert/release_tree.h>

#include <unordered_map>
#include <vector>

namespace wrapcert {

void release_tree(ModulePtr root) {
  // Hold every module of the tree, parents before children; releasing them in that order means
  // a parent's destructor never drops the last reference to a child.
  std::vector<ModulePtr> order;
  std::unordered_map<const torch::nn::Module*, bool> seen;
  order.push_back(std::move(root));
  for (size_t i = 0; i < order.size(); ++i) {
    if (!order[i]) continue;
    for (const auto& child : order[i]->named_children()) {
      if (seen.emplace(child.value().get(), true).second) order.push_back(child.value());
    }
  }
  for (auto& module : order) module.reset();
}

}  // namespace wrapcert
