#include <wrapcert/detail/path.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/io/check_keys.h>
#include <wrapcert/io/checkpoint_file.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

namespace wrapcert {
namespace {

std::vector<std::string> components(const std::string& key) {
  const auto parts = detail::split_path(key);
  return {parts.begin(), parts.end()};
}

std::string join(const std::vector<std::string>& parts, const std::vector<bool>& keep) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!keep[i]) continue;
    if (!first) out += '.';
    out += parts[i];
    first = false;
  }
  return out;
}

std::string describe(const KeyInfo& k) {
  std::string out = "[";
  for (size_t i = 0; i < k.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(k.shape[i]);
  return out + "] " + detail::python_dtype_name(k.dtype);
}

std::set<std::string> slot_names(const Registry& registry) {
  std::set<std::string> slots;
  for (const auto& kind : registry.kinds()) slots.insert(kind.slot);
  return slots;
}

/// A name a user may also give a child is a wrapper's only as the first component.
bool only_a_wrapper_puts(const std::string& slot, size_t position) {
  return position == 0 || (!slot.empty() && slot.front() == '_');
}

void scan_key(const std::string& key, const std::set<std::string>& slots, KeyReport& report) {
  const auto parts = components(key);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (slots.count(parts[i]) && only_a_wrapper_puts(parts[i], i)) {
      report.leftover.emplace_back(key, "component " + std::to_string(i) + ": " + parts[i]);
    }
  }
}

void add_ties(const std::vector<KeyInfo>& found, KeyReport& report) {
  for (const auto& f : found) {
    if (!f.tied_to.empty()) report.ties.emplace_back(f.key, f.tied_to);
  }
}

}  // namespace

std::vector<KeyInfo> key_infos(const StateDict& state) {
  std::unordered_map<std::string, std::string> tied;
  for (const auto& group : storage_ties(state)) {
    for (size_t i = 1; i < group.size(); ++i) tied.emplace(group[i], group[0]);
  }
  std::vector<KeyInfo> out;
  for (const auto& item : state) {
    const auto it = tied.find(item.key());
    out.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type(),
                   it == tied.end() ? "" : it->second});
  }
  return out;
}

const char* to_string(KeyStatus status) {
  switch (status) {
    case KeyStatus::kClean:
      return "clean";
    case KeyStatus::kFixable:
      return "fixable";
    case KeyStatus::kBroken:
      return "broken";
    case KeyStatus::kLeftover:
      return "wrapper components found";
  }
  return "unknown";
}

KeyReport check_keys(const std::vector<KeyInfo>& found, const std::vector<KeyInfo>& expected,
                     const Registry& registry, const CheckKeysOptions& options) {
  const auto slots = slot_names(registry);
  std::unordered_map<std::string, const KeyInfo*> want;
  for (const auto& e : expected) want.emplace(e.key, &e);
  std::set<std::string> found_keys;
  for (const auto& f : found) found_keys.insert(f.key);

  KeyReport report;
  std::set<std::string> matched;
  auto compare = [&](const KeyInfo& f, const std::string& target) {
    const auto* e = want.at(target);
    if (options.compare_shapes && (f.shape != e->shape || f.dtype != e->dtype)) {
      report.mismatched.push_back(f.key + ": found " + describe(f) + ", expected " + describe(*e));
    }
    matched.insert(target);
  };
  for (const auto& f : found) {
    if (want.count(f.key)) {
      compare(f, f.key);
      continue;
    }
    const auto parts = components(f.key);
    std::vector<size_t> slot_positions;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (slots.count(parts[i])) slot_positions.push_back(i);
    }
    // Every way of dropping some of the slot components (few per key); exactly one must hit.
    std::map<std::string, uint32_t> candidates;
    const size_t n = std::min<size_t>(slot_positions.size(), 12);
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      std::vector<bool> keep(parts.size(), true);
      for (size_t b = 0; b < n; ++b) {
        if (mask & (1u << b)) keep[slot_positions[b]] = false;
      }
      const auto candidate = join(parts, keep);
      if (want.count(candidate) && !found_keys.count(candidate))
        candidates.emplace(candidate, mask);
    }
    if (candidates.size() == 1) {
      const auto& [target, mask] = *candidates.begin();
      for (size_t b = 0; b < n; ++b) {
        if (mask & (1u << b)) {
          const auto i = slot_positions[b];
          report.leftover.emplace_back(f.key, "component " + std::to_string(i) + ": " + parts[i]);
        }
      }
      report.translation.emplace_back(f.key, target);
      compare(f, target);
    } else {
      scan_key(f.key, slots, report);
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
  add_ties(found, report);
  if (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty()) {
    report.status = KeyStatus::kBroken;
  } else if (!report.translation.empty()) {
    report.status = KeyStatus::kFixable;
  }
  return report;
}

KeyReport scan_keys(const std::vector<KeyInfo>& found, const Registry& registry) {
  const auto slots = slot_names(registry);
  KeyReport report;
  for (const auto& f : found) scan_key(f.key, slots, report);
  add_ties(found, report);
  report.status = report.leftover.empty() ? KeyStatus::kClean : KeyStatus::kLeftover;
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
  if (!r.ties.empty()) {
    out << "tied keys, saved once (" << r.ties.size() << "):\n";
    for (const auto& [key, to] : r.ties) out << "  " << key << " = " << to << "\n";
  }
  return out.str();
}

std::vector<KeyInfo> read_key_listing(const std::string& path) {
  // Read once, front to back: a pipe is welcome here (`--keys <(...)`), a folder is not.
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw Error(ErrorCode::kInvalidArgument, path,
                "cannot read the key listing '" + path + "': it is a directory");
  }
  std::ifstream lines(path);
  if (!lines) {
    throw Error(ErrorCode::kInvalidArgument, path, "cannot read the key listing '" + path + "'");
  }
  std::vector<KeyInfo> keys;
  for (std::string line; std::getline(lines, line);) {
    const auto key = line.substr(0, line.find_first_of(" \t\r"));
    if (!key.empty()) keys.push_back({key, {}, c10::kFloat, ""});
  }
  return keys;
}

}  // namespace wrapcert
