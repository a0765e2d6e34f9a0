#include <wrapcert/check_keys.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/torch_save.h>

#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace wrapcert {
namespace {

std::vector<std::string> split(const std::string& key) {
  std::vector<std::string> parts;
  std::istringstream in(key);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

std::string join(const std::vector<std::string>& parts, const std::vector<bool>& keep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!keep[i]) continue;
    if (!out.empty()) out += '.';
    out += parts[i];
  }
  return out;
}

std::string describe(const KeyInfo& k) {
  std::string out = "[";
  for (size_t i = 0; i < k.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(k.shape[i]);
  return out + "] " + detail::python_dtype_name(k.dtype);
}

}  // namespace

std::vector<KeyInfo> key_infos(const SafetensorsHeader& header, const std::string& path) {
  // Files wrapcert wrote list every key, tied ones as aliases of the stored tensor.
  std::unordered_map<std::string, const SafetensorsEntry*> stored;
  for (const auto& t : header.tensors) stored.emplace(t.key, &t);
  std::vector<KeyInfo> out;
  for (const auto& [key, target] : saved_keys(header, path)) {
    out.push_back({key, stored.at(target)->shape, stored.at(target)->dtype});
  }
  return out;
}

std::vector<KeyInfo> key_infos(const StateDict& state) {
  std::vector<KeyInfo> out;
  for (const auto& item : state) {
    out.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  return out;
}

namespace {
/// `torch.save` writes a zip archive: it starts with "PK\x03\x04".
bool is_zip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}
}  // namespace

std::vector<KeyInfo> checkpoint_key_infos(const std::string& path) {
  return is_zip(path) ? key_infos(load_torch_save(path))
                      : key_infos(read_safetensors_header(path), path);
}

StateDict load_checkpoint(const std::string& path) {
  return is_zip(path) ? load_torch_save(path) : load_safetensors(path);
}

const char* to_string(KeyStatus status) {
  switch (status) {
    case KeyStatus::kClean:
      return "clean";
    case KeyStatus::kFixable:
      return "fixable";
    case KeyStatus::kBroken:
      return "broken";
  }
  return "unknown";
}

KeyReport check_keys(const std::vector<KeyInfo>& found, const std::vector<KeyInfo>& expected,
                     const Registry& registry) {
  std::set<std::string> slots;
  for (const auto& kind : registry.kinds()) slots.insert(kind.slot);
  std::unordered_map<std::string, const KeyInfo*> want;
  for (const auto& e : expected) want.emplace(e.key, &e);
  std::set<std::string> found_keys;
  for (const auto& f : found) found_keys.insert(f.key);

  KeyReport report;
  std::set<std::string> matched;
  auto compare = [&](const KeyInfo& f, const std::string& target) {
    const auto* e = want.at(target);
    if (f.shape != e->shape || f.dtype != e->dtype) {
      report.mismatched.push_back(f.key + ": found " + describe(f) + ", expected " + describe(*e));
    }
    matched.insert(target);
  };
  for (const auto& f : found) {
    const auto parts = split(f.key);
    std::vector<size_t> slot_positions;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (slots.count(parts[i])) slot_positions.push_back(i);
    }
    if (want.count(f.key)) {
      compare(f, f.key);
      continue;
    }
    for (size_t i : slot_positions) {
      report.leftover.emplace_back(f.key, "component " + std::to_string(i) + ": " + parts[i]);
    }
    // Every way of dropping some of the slot components (few per key); exactly one must hit.
    std::set<std::string> candidates;
    const size_t n = std::min<size_t>(slot_positions.size(), 12);
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      std::vector<bool> keep(parts.size(), true);
      for (size_t b = 0; b < n; ++b) {
        if (mask & (1u << b)) keep[slot_positions[b]] = false;
      }
      const auto candidate = join(parts, keep);
      if (want.count(candidate) && !found_keys.count(candidate)) candidates.insert(candidate);
    }
    if (candidates.size() == 1) {
      report.translation.emplace_back(f.key, *candidates.begin());
      compare(f, *candidates.begin());
    } else {
      report.unexpected.push_back(f.key);
    }
  }
  for (const auto& e : expected) {
    if (!matched.count(e.key)) report.missing.push_back(e.key);
  }
  // Two found keys translated onto one expected key: not one-to-one.
  std::set<std::string> targets;
  for (const auto& [from, to] : report.translation) {
    if (!targets.insert(to).second) report.unexpected.push_back(from);
  }
  if (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty()) {
    report.status = KeyStatus::kBroken;
  } else if (!report.translation.empty()) {
    report.status = KeyStatus::kFixable;
  }
  return report;
}

std::string to_text(const KeyReport& r) {
  std::ostringstream out;
  out << "status: " << to_string(r.status) << "\n";
  auto section = [&out](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    out << title << " (" << items.size() << "):\n";
    for (const auto& i : items) out << "  " << i << "\n";
  };
  if (!r.leftover.empty()) {
    out << "leftover wrapper components (" << r.leftover.size() << "):\n";
    for (const auto& [key, where] : r.leftover) out << "  " << key << "  (" << where << ")\n";
  }
  if (!r.translation.empty()) {
    out << "translation that fixes the file (" << r.translation.size() << "):\n";
    for (const auto& [from, to] : r.translation) out << "  " << from << " -> " << to << "\n";
  }
  section("missing keys", r.missing);
  section("unexpected keys", r.unexpected);
  section("shape or dtype mismatches", r.mismatched);
  return out.str();
}

}  // namespace wrapcert
