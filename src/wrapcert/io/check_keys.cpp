#include <wrapcert/detail/path.h>
#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/io/check_keys.h>
#include <wrapcert/io/checkpoint_file.h>

#include <algorithm>
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
  if (!k.tensor) return "a value that is not a tensor";
  std::string out = "[";
  for (size_t i = 0; i < k.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(k.shape[i]);
  return out + "] " + detail::python_dtype_name(k.dtype);
}

std::set<std::string> slot_names(const Registry& registry) {
  std::set<std::string> slots;
  for (const auto& kind : registry.kinds()) slots.insert(kind.slot);
  // FlattenParamsWrapper's slot inside FSDP before PyTorch 1.13: no kind of its own, since it
  // never wraps a model by itself, but its component is left in FSDP's parameter names.
  slots.insert("_fpw_module");
  return slots;
}

/// A name a user may also give a child (`module`) is a wrapper's only at the start of a key:
/// the first component, or after a run of wrapper components (`_orig_mod.module.`, which
/// torch.compile over DDP leaves).
void scan_key(const std::string& key, const std::set<std::string>& slots, KeyReport& report) {
  const auto parts = components(key);
  bool leading = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool slot = slots.count(parts[i]) > 0;
    if (slot && (leading || parts[i].front() == '_')) {
      report.leftover.emplace_back(key, "component " + std::to_string(i) + ": " + parts[i]);
    }
    leading = leading && slot;
  }
}

/// Why a saved key cannot load into a model as it is, or "".
std::string cannot_load(const KeyInfo& k, bool zero3) {
  const auto parts = components(k.key);
  const auto& last = parts.empty() ? k.key : parts.back();
  if (last == "flat_param" || last == "_flat_param") {
    return "a flat parameter: FSDP's local state dict or its named_parameters() hold many "
           "parameters flattened into one; save FSDP's full state dict "
           "(StateDictType.FULL_STATE_DICT) instead";
  }
  if (zero3 && k.tensor && k.shape == std::vector<int64_t>{0}) {
    return "a ZeRO-3 placeholder: DeepSpeed keeps the weights partitioned in "
           "zero_pp_rank_*_optim_states.pt; consolidate them with the zero_to_fp32.py script "
           "saved beside the checkpoint";
  }
  return "";
}

void add_unloadable(const std::vector<KeyInfo>& found, KeyReport& report) {
  for (const auto& f : found) {
    if (!f.cannot_load.empty()) report.unloadable.emplace_back(f.key, f.cannot_load);
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
    KeyInfo k;
    k.key = item.key();
    k.tensor = item.value().defined();  // false: extra state that is not a tensor
    if (k.tensor) {
      k.shape = item.value().sizes().vec();
      k.dtype = item.value().scalar_type();
      k.tied_to = it == tied.end() ? "" : it->second;
    }
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<KeyInfo> key_infos(const Checkpoint& checkpoint) {
  auto out = key_infos(checkpoint.state);
  // DeepSpeed's model states: the state dict under "module", its own entries beside it.
  const auto& other = checkpoint.other_entries;
  const bool deepspeed = std::find(other.begin(), other.end(), "ds_version") != other.end() ||
                         std::find(other.begin(), other.end(), "param_shapes") != other.end();
  for (auto& k : out) k.cannot_load = cannot_load(k, deepspeed);
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
    if (options.compare_shapes &&
        (f.tensor != e->tensor ||
         (f.tensor && (f.shape != e->shape || (options.compare_dtypes && f.dtype != e->dtype))))) {
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
    if (matched.count(e.key)) continue;
    // Transformers saves a tied weight once: the key it ties is left out, not missing.
    if (!e.tied_to.empty() && matched.count(e.tied_to)) {
      report.tied_left_out.emplace_back(e.key, e.tied_to);
    } else {
      report.missing.push_back(e.key);
    }
  }
  // Two found keys translated onto one expected key: not one-to-one.
  std::set<std::string> targets;
  for (const auto& [from, to] : report.translation) {
    if (!targets.insert(to).second) report.unexpected.push_back(from);
  }
  add_ties(found, report);
  add_unloadable(found, report);
  if (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty() ||
      !report.unloadable.empty()) {
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
  add_unloadable(found, report);
  report.status = !report.unloadable.empty() ? KeyStatus::kBroken
                  : report.leftover.empty()  ? KeyStatus::kClean
                                             : KeyStatus::kLeftover;
  return report;
}

void print(std::ostream& out, const KeyReport& r) {
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
  if (!r.unloadable.empty()) {
    out << "keys that cannot load into a model as saved (" << r.unloadable.size() << "):\n";
    std::string said;  // the reason once, where it changes
    for (const auto& [key, why] : r.unloadable) {
      out << "  " << key << "\n";
      if (why != said) out << "    " << why << "\n";
      said = why;
    }
  }
  if (!r.ties.empty()) {
    out << "tied keys, saved once (" << r.ties.size() << "):\n";
    for (const auto& [key, to] : r.ties) out << "  " << key << " = " << to << "\n";
  }
  if (!r.tied_left_out.empty()) {
    out << "tied keys left out, as Transformers saves them (" << r.tied_left_out.size() << "):\n";
    for (const auto& [key, to] : r.tied_left_out) out << "  " << key << " = " << to << "\n";
  }
}

std::string to_text(const KeyReport& r) {
  std::ostringstream out;
  print(out, r);
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
    if (!key.empty()) {
      keys.emplace_back();
      keys.back().key = key;
    }
  }
  if (lines.bad()) {
    throw Error(ErrorCode::kInvalidArgument, path, "cannot read the key listing '" + path + "'");
  }
  if (keys.empty()) {
    throw Error(ErrorCode::kInvalidArgument, path,
                "the key listing '" + path + "' holds no key: nothing to compare with");
  }
  return keys;
}

}  // namespace wrapcert
