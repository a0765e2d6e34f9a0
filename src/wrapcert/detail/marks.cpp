#include <wrapcert/detail/marks.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace wrapcert::detail {
namespace {

struct Marks {
  struct Entry {
    std::weak_ptr<torch::nn::Module> owner;
    std::vector<std::string> marks;
  };
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, Entry> entries;
  std::atomic<size_t> count{0};  // entries.size(), readable without the lock
};

Marks& marks() {
  static auto* table = new Marks;  // never destroyed: usable from static destructors
  return *table;
}

struct Held {
  struct Entry {
    std::weak_ptr<torch::nn::Module> owner;
    std::vector<std::pair<std::string, torch::Tensor>> params;
  };
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, Entry> entries;
  std::atomic<size_t> count{0};
};

Held& held() {
  static auto* table = new Held;  // never destroyed
  return *table;
}

}  // namespace

void hold_parameters(const std::shared_ptr<torch::nn::Module>& owner,
                     std::vector<std::pair<std::string, torch::Tensor>> params) {
  auto& t = held();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.entries[owner.get()] = {owner, std::move(params)};
  t.count = t.entries.size();
}

void drop_held_parameters(const torch::nn::Module& owner) {
  auto& t = held();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.entries.erase(&owner);
  t.count = t.entries.size();
}

std::vector<std::pair<std::string, torch::Tensor>> held_parameters(const torch::nn::Module& owner) {
  auto& t = held();
  if (t.count.load(std::memory_order_relaxed) == 0) return {};
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.entries.find(&owner);
  if (it == t.entries.end() || it->second.owner.expired()) return {};
  return it->second.params;
}

void add_mark(const std::shared_ptr<torch::nn::Module>& module, std::string mark) {
  auto& t = marks();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& entry = t.entries[module.get()];
  if (entry.owner.expired()) entry = {module, {}};  // new, or a dead module's address reused
  if (std::find(entry.marks.begin(), entry.marks.end(), mark) == entry.marks.end()) {
    entry.marks.push_back(std::move(mark));
  }
  t.count = t.entries.size();
}

void remove_mark(const torch::nn::Module& module, std::string_view mark) {
  auto& t = marks();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.entries.find(&module);
  if (it == t.entries.end()) return;
  auto& m = it->second.marks;
  m.erase(std::remove(m.begin(), m.end(), mark), m.end());
  if (m.empty() || it->second.owner.expired()) t.entries.erase(it);
  t.count = t.entries.size();
}

bool has_mark(const torch::nn::Module& module, std::string_view mark) {
  auto& t = marks();
  if (t.count.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.entries.find(&module);
  if (it == t.entries.end()) return false;
  if (it->second.owner.expired()) {
    t.entries.erase(it);
    t.count = t.entries.size();
    return false;
  }
  const auto& m = it->second.marks;
  return std::find(m.begin(), m.end(), mark) != m.end();
}

}  // namespace wrapcert::detail
