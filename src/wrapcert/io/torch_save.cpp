#include <wrapcert/detail/path.h>
#include <wrapcert/error.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/pickle.h>
#include <wrapcert/io/detail/pickle_machine.h>
#include <wrapcert/io/torch_save.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/types.h>
#include <zip.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

using detail::Ptr;
using detail::Reader;
using detail::storage_types;
using detail::Value;

/// An `nn.Module` pickled whole (`torch.save(model)`): an object whose state holds `_modules`
/// and `_parameters`.
bool is_module(const Value* v) {
  if (v->kind != Value::Kind::kObject || !v->state || v->state->kind != Value::Kind::kDict) {
    return false;
  }
  int found = 0;
  for (const auto& [k, value] : v->state->dict) {
    found += k->kind == Value::Kind::kString && (k->s == "_modules" || k->s == "_parameters");
  }
  return found == 2;
}

/// A global as Python spells it: "torch.nn.Linear" for "torch.nn Linear".
std::string dotted(std::string global) {
  std::replace(global.begin(), global.end(), ' ', '.');
  return global;
}

std::string describe(const Value* v) {
  switch (v->kind) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return "a bool";
    case Value::Kind::kInt:
      return "an int";
    case Value::Kind::kFloat:
      return "a float";
    case Value::Kind::kString:
      return "a string";
    case Value::Kind::kTuple:
      return "a tuple";
    case Value::Kind::kList:
      return "a list";
    case Value::Kind::kDict:
      return "a dict";
    case Value::Kind::kGlobal:
      return "the class '" + v->s + "'";
    case Value::Kind::kTensor:
      return "a tensor";
    case Value::Kind::kObject:
      return is_module(v) ? "a pickled module of class '" + dotted(v->s) + "'"
                          : "an object of '" + v->s + "'";
    case Value::Kind::kMark:
      return "a mark";
  }
  return "a value";
}

/// A module's `get_extra_state()` result: any object, saved under `..._extra_state`.
bool is_extra_state(const std::string& key) {
  const std::string_view name = "_extra_state";
  return key.size() >= name.size() &&
         key.compare(key.size() - name.size(), name.size(), name) == 0 &&
         (key.size() == name.size() || key[key.size() - name.size() - 1] == '.');
}

/// One rank's part of a sharded state dict: a value that is no tensor anyone can load alone.
bool is_sharded_value(const Value* v) {
  return v->kind == Value::Kind::kObject && (v->s.find("ShardedTensor") != std::string::npos ||
                                             v->s.find(" DTensor") != std::string::npos);
}

/// How deep dicts of tensors nest in a state dict (Megatron's `model.language_model.embedding`).
constexpr int kMaxNesting = 16;

/// A dict of tensors keyed by strings, or (up to `depth` levels below it) of such dicts, whose
/// keys join with '.' as a module's do: Megatron saves its model that way. A dict met twice (a
/// pickle's dict inside itself, or shared) is none: each dict is looked at once.
bool is_state_dict(const Value* v, int depth, std::unordered_set<const Value*>& seen) {
  if (v->kind != Value::Kind::kDict || !seen.insert(v).second) return false;
  for (const auto& [k, value] : v->dict) {
    if (k->kind != Value::Kind::kString) return false;
    if (value->kind == Value::Kind::kTensor || is_sharded_value(value) || is_extra_state(k->s)) {
      continue;
    }
    if (depth > 0 && value->kind == Value::Kind::kDict && !value->dict.empty() &&
        is_state_dict(value, depth - 1, seen)) {
      continue;
    }
    return false;
  }
  return true;
}

bool is_state_dict(const Value* v, int depth = kMaxNesting) {
  std::unordered_set<const Value*> seen;
  return is_state_dict(v, depth, seen);
}

std::string key_text(const Value* k) {
  return k->kind == Value::Kind::kString ? k->s
         : k->kind == Value::Kind::kInt  ? std::to_string(k->i)
                                         : "<" + describe(k) + ">";
}

constexpr const char* kModuleWayOut =
    "its keys are its attributes' names, which only the module's own code gives: load it in "
    "Python and save what check-keys reads, torch.save(module.state_dict(), 'model.pt') (for a "
    "trainer's dict, replace the entry by the module's state_dict())";

const Value* find_entry(const Value* dict, const std::string& name) {
  for (const auto& [k, v] : dict->dict) {
    if (k->kind == Value::Kind::kString && k->s == name) return v;
  }
  return nullptr;
}

std::string entry_names(const Value* dict) {
  std::string out;
  for (const auto& [k, v] : dict->dict) out += (out.empty() ? "" : ", ") + key_text(k);
  return out.empty() ? "none" : out;
}

}  // namespace

namespace detail {

const std::vector<std::string>& usual_state_dict_entries() {
  static const std::vector<std::string> names = {"state_dict", "model", "module",
                                                 "model_state_dict"};
  return names;
}

PickledStateDict read_state_dict_pickle(const char* data, size_t size, const std::string& path,
                                        const std::string& entry) {
  PickledStateDict out;
  Reader reader(path, data, size, 0, out.storages);
  const Value* root = reader.run();
  out.end = reader.pos();
  out.frames = reader.frames();
  if (is_module(root)) {
    throw Error(ErrorCode::kUnsupported, "",
                path + ": the file holds " + describe(root) + " (torch.save(model)), not a state " +
                    "dict; " + kModuleWayOut);
  }
  if (root->kind != Value::Kind::kDict)
    reader.fail("", "the file holds " + describe(root) + ", not a dict");
  const Value* chosen = root;
  if (!entry.empty()) {
    std::string walked;
    std::string_view part;
    for (detail::PathComponents components(entry); components.next(part);) {
      const std::string name(part);
      if (chosen->kind != Value::Kind::kDict) {
        reader.fail(walked, "entry '" + walked + "' holds " + describe(chosen) + ", not a dict");
      }
      const Value* next = find_entry(chosen, name);
      if (!next) {
        reader.fail(walked.empty() ? name : walked + "." + name,
                    "no entry '" + name + "'" + (walked.empty() ? "" : " in '" + walked + "'") +
                        " (entries: " + entry_names(chosen) + ")");
      }
      walked = detail::join_path(walked, name);
      chosen = next;
    }
    out.entry = entry;
  } else if (!is_state_dict(root, /*depth=*/0)) {
    for (const auto& name : usual_state_dict_entries()) {
      const Value* v = find_entry(root, name);
      if (v && is_state_dict(v)) {
        chosen = v;
        out.entry = name;
        break;
      }
    }
    if (chosen == root && !root->dict.empty() && is_state_dict(root)) {
      // dicts of tensors nested at the root: the root, its keys joined
    } else if (chosen == root) {
      for (const auto& [k, v] : root->dict) {  // {"model": model, "epoch": 3}
        if (is_module(v)) {
          throw Error(ErrorCode::kUnsupported, key_text(k),
                      path + ": entry '" + key_text(k) + "' holds " + describe(v) +
                          ", not a state dict; " + kModuleWayOut);
        }
      }
      // Name the first value that is not a tensor: a plain state dict with one bad value.
      for (const auto& [k, v] : root->dict) {
        if (k->kind == Value::Kind::kString && v->kind == Value::Kind::kTensor) continue;
        reader.fail(key_text(k),
                    "not a state dict: entry '" + key_text(k) + "' holds " + describe(v) +
                        ", and none of state_dict, model, module, model_state_dict is a dict "
                        "of tensors (entries: " +
                        entry_names(root) + "); name the entry that holds it");
      }
    }
  }
  if (chosen->kind != Value::Kind::kDict) {
    if (is_module(chosen)) {
      throw Error(ErrorCode::kUnsupported, out.entry,
                  path + ": entry '" + out.entry + "' holds " + describe(chosen) +
                      ", not a state dict; " + kModuleWayOut);
    }
    reader.fail(out.entry, "entry '" + out.entry + "' holds " + describe(chosen) + ", not a dict");
  }
  if (chosen != root) {
    const auto top = out.entry.substr(0, out.entry.find('.'));
    for (const auto& [k, v] : root->dict) {
      if (key_text(k) == top) continue;
      // Other state dicts beside the chosen one (an EMA's), when none was asked for.
      const bool more = entry.empty() && k->kind == Value::Kind::kString &&
                        v->kind == Value::Kind::kDict && !v->dict.empty() && is_state_dict(v);
      (more ? out.more_state_dicts : out.other_entries).push_back(key_text(k));
    }
  }
  // Keys in saved order; a nested dict's keys joined to its own with '.'.
  const std::function<void(const Value*, const std::string&, int)> collect =
      [&](const Value* dict, const std::string& prefix, int depth) {
        for (const auto& [k, v] : dict->dict) {
          if (k->kind != Value::Kind::kString) {
            reader.fail(prefix + key_text(k), "a key that is not a string (" + describe(k) + ")");
          }
          const auto key = prefix + k->s;
          if (is_sharded_value(v)) {
            throw Error(
                ErrorCode::kUnsupported, key,
                path + ": the value is " + describe(v) +
                    ", one rank's part of a sharded state dict (FSDP's SHARDED_STATE_DICT or "
                    "LOCAL_STATE_DICT), which loads only into the same sharded model; save a full "
                    "state dict (FullyShardedDataParallel.state_dict_type(model, "
                    "StateDictType.FULL_STATE_DICT)) and check that");
          }
          const bool extra = v->kind != Value::Kind::kTensor && is_extra_state(key);
          if (!extra && v->kind == Value::Kind::kDict && !v->dict.empty() && depth < kMaxNesting &&
              is_state_dict(v, kMaxNesting - depth - 1)) {
            collect(v, key + ".", depth + 1);
            continue;
          }
          if (v->kind != Value::Kind::kTensor && !extra) {
            if (is_module(v)) {
              throw Error(
                  ErrorCode::kUnsupported, key,
                  path + ": the value is " + describe(v) + ", not a tensor; " + kModuleWayOut);
            }
            reader.fail(key, "the value is " + describe(v) + ", not a tensor" +
                                 (out.entry.empty() ? "" : " (in entry '" + out.entry + "')"));
          }
          if (out.state.contains(key)) reader.fail(key, "the key is saved twice");
          // A module's extra state that is not a tensor is kept as a key with no tensor.
          out.state.insert(key, extra ? torch::Tensor() : v->tensor);
          out.storage_of.push_back(extra ? kNoStorage : v->storage);
          out.key_spans.push_back({k->begin, k->end, k->reused, prefix.size()});
        }
      };
  collect(chosen, "", 0);
  return out;
}

std::string rename_pickled_keys(const char* data, const PickledStateDict& pickled,
                                const KeyRenames& renames, const std::string& path) {
  return rename_pickled_keys(data, {{&pickled, &renames}}, path);
}

std::string rename_pickled_keys(
    const char* data,
    const std::vector<std::pair<const PickledStateDict*, const KeyRenames*>>& parts,
    const std::string& path) {
  struct Edit {
    size_t begin, end;
    std::string bytes;
  };
  std::vector<Edit> edits;
  if (parts.empty()) throw Error(ErrorCode::kInvalidArgument, "", path + ": nothing to rename");
  const auto& first = *parts.front().first;
  for (size_t f : first.frames) edits.push_back({f, f + 9, ""});
  for (const auto& [pickled, renames] : parts) {
    std::unordered_map<std::string, std::string> to(renames->begin(), renames->end());
    size_t i = 0;
    for (const auto& item : pickled->state) {
      const auto& span = pickled->key_spans[i++];
      const auto it = to.find(item.key());
      if (it == to.end() || it->second == item.key()) continue;
      if (span.reused) {
        throw detail::malformed_file(
            path,
            "the pickle refers to the key's string elsewhere too; renaming it would rename that "
            "as well, so wrapcert leaves this file as it is",
            item.key());
      }
      if (it->second.compare(0, span.prefix, item.key(), 0, span.prefix) != 0) {
        throw Error(ErrorCode::kUnsupported, item.key(),
                    path + ": the key lies in nested dicts ('" +
                        item.key().substr(0, span.prefix - 1) + "') that the translation to '" +
                        it->second +
                        "' renames; wrapcert renames only the last part of a nested key, so "
                        "it leaves this file as it is");
      }
      const auto rest = it->second.substr(span.prefix);
      const auto n = static_cast<uint32_t>(rest.size());
      std::string op(5, 'X');  // BINUNICODE: a 4-byte little-endian length, then UTF-8
      for (int b = 0; b < 4; ++b) op[1 + b] = static_cast<char>((n >> (8 * b)) & 0xff);
      edits.push_back({span.begin, span.end, op + rest});
    }
  }
  std::sort(edits.begin(), edits.end(),
            [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  for (size_t e = 1; e < edits.size(); ++e) {
    if (edits[e].begin < edits[e - 1].end) {
      throw detail::malformed_file(path,
                                   "two state dicts share a key's string; wrapcert leaves "
                                   "this file as it is");
    }
  }
  std::string out;
  out.reserve(first.end + 64 * edits.size());
  size_t at = 0;
  for (const auto& e : edits) {
    out.append(data + at, e.begin - at);
    out += e.bytes;
    at = e.end;
  }
  out.append(data + at, first.end - at);
  return out;
}

}  // namespace detail

namespace {

/// The zip archive `torch.save` writes: records under one folder ("archive/data.pkl",
/// "archive/data/0"), stored uncompressed. Read through libzip with its consistency checks; a
/// record's CRC is checked when it is read whole.
class ZipArchive {
 public:
  explicit ZipArchive(detail::InputFile& file) : path_(file.path()) {
    int err = 0;
    zip_ = ::zip_fdopen(file.fd(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (!zip_) {
      zip_error_t error;
      zip_error_init_with_code(&error, err);
      const std::string what = zip_error_strerror(&error);
      zip_error_fini(&error);
      throw detail::malformed_file(path_, "not a readable torch.save zip archive (" + what + ")");
    }
    file.release();  // libzip owns the descriptor now
    if (::zip_get_num_entries(zip_, 0) < 1)
      throw detail::malformed_file(path_, "an empty zip archive");
    const std::string first = ::zip_get_name(zip_, 0, ZIP_FL_ENC_RAW);
    const auto slash = first.find('/');
    if (slash == std::string::npos)
      throw detail::malformed_file(path_, "a zip archive without torch.save's folder");
    prefix_ = first.substr(0, slash + 1);
  }
  ~ZipArchive() {
    if (zip_) ::zip_discard(zip_);
  }
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  /// Every record's name under the archive's folder, in the archive's order. A record outside
  /// that folder is damage: `torch.save` writes none, and a copy could not keep it.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    const auto n = ::zip_get_num_entries(zip_, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const std::string name = ::zip_get_name(zip_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
      if (name.compare(0, prefix_.size(), prefix_) != 0) {
        throw detail::malformed_file(
            path_, "record " + name + " lies outside the archive's folder " + prefix_);
      }
      out.push_back(name.substr(prefix_.size()));
    }
    return out;
  }

  /// The record's size, or -1 when the archive lacks it.
  int64_t size(const std::string& name) const {
    zip_stat_t st;
    zip_stat_init(&st);
    if (::zip_stat(zip_, (prefix_ + name).c_str(), ZIP_FL_ENC_RAW, &st) != 0) return -1;
    return static_cast<int64_t>(st.size);
  }

  void read(const std::string& name, void* out, uint64_t n) const {
    zip_file_t* f = ::zip_fopen(zip_, (prefix_ + name).c_str(), ZIP_FL_ENC_RAW);
    if (!f) throw detail::malformed_file(path_, "the archive lacks record " + name);
    auto* bytes = static_cast<char*>(out);
    uint64_t done = 0;
    char extra = 0;
    bool ok = true;
    while (ok && done < n) {
      const auto got = ::zip_fread(f, bytes + done, n - done);
      ok = got > 0;
      if (ok) done += static_cast<uint64_t>(got);
    }
    // One more read reaches the end, where libzip compares the record's CRC.
    ok = ok && ::zip_fread(f, &extra, 1) == 0;
    const std::string what = ok ? "" : ::zip_strerror(zip_);
    const std::string file_error = ok ? "" : ::zip_file_strerror(f);
    ::zip_fclose(f);
    if (!ok)
      throw detail::malformed_file(path_, "record " + name + " is damaged (" + file_error + ")");
  }

  std::string read_all(const std::string& name) const {
    const auto n = size(name);
    if (n < 0) throw detail::malformed_file(path_, "the archive lacks record " + name);
    std::string out(static_cast<size_t>(n), '\0');
    read(name, out.data(), static_cast<uint64_t>(n));
    return out;
  }

 private:
  std::string path_;
  zip_t* zip_ = nullptr;
  std::string prefix_;
};

/// The legacy format: five pickles (magic number, protocol version, system info, the object,
/// the storage keys), then each storage as an 8-byte element count and its bytes.
constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};

bool starts_with(const detail::InputFile& file, const unsigned char* magic, size_t n) {
  if (file.size() < n) return false;
  std::string head(n, '\0');
  file.read_at(0, head.data(), n);
  return std::memcmp(head.data(), magic, n) == 0;
}

/// Replaces each meta tensor of `pickled.state` by a view of its storage's data.
template <typename Load>
StateDict with_data(const detail::PickledStateDict& pickled, const Load& load) {
  std::vector<torch::Tensor> data(pickled.storages.size());
  StateDict state;
  size_t i = 0;
  for (const auto& item : pickled.state) {
    const size_t s = pickled.storage_of[i++];
    if (s == detail::kNoStorage) {
      state.insert(item.key(), item.value());
      continue;
    }
    if (!data[s].defined()) {
      const auto& storage = pickled.storages[s];
      data[s] = torch::empty({storage.numel}, torch::TensorOptions().dtype(storage.dtype));
      load(s, data[s]);
    }
    const auto& meta = item.value();
    state.insert(item.key(),
                 data[s].as_strided(meta.sizes(), meta.strides(), meta.storage_offset()));
  }
  return state;
}

TorchSaveFile read_zip(detail::InputFile& file, const TorchSaveOptions& options) {
  const std::string path = file.path();
  ZipArchive archive(file);
  const auto names = archive.names();
  const auto script = std::find_if(names.begin(), names.end(), [](const std::string& n) {
    return n == "constants.pkl" || n.rfind("code/", 0) == 0;
  });
  if (script != names.end()) {
    throw Error(ErrorCode::kUnsupported, "",
                path + ": a TorchScript archive (torch.jit.save: it holds " + *script +
                    "), a compiled module rather than a state dict; its state dict is "
                    "torch.jit.load(path).state_dict(): save that with torch.save and check it");
  }
  const auto pickle = archive.read_all("data.pkl");
  auto pickled = detail::read_state_dict_pickle(pickle.data(), pickle.size(), path, options.entry);
  // Every storage the pickle names is in the archive with its exact size.
  for (const auto& s : pickled.storages) {
    const auto want = static_cast<int64_t>(s.numel * c10::elementSize(s.dtype));
    const auto have = archive.size("data/" + s.key);
    if (have < 0) throw detail::malformed_file(path, "the archive lacks storage data/" + s.key);
    if (have != want) {
      throw detail::malformed_file(path, "storage data/" + s.key + " holds " +
                                             std::to_string(have) + " bytes, not " +
                                             std::to_string(s.numel) + " elements of " +
                                             std::to_string(c10::elementSize(s.dtype)));
    }
  }
  TorchSaveFile out{StateDict(), "torch.save zip", pickled.entry, pickled.other_entries,
                    pickled.more_state_dicts};
  out.state = !options.data
                  ? std::move(pickled.state)
                  : with_data(pickled, [&](size_t s, torch::Tensor& t) {
                      archive.read("data/" + pickled.storages[s].key, t.data_ptr(), t.nbytes());
                    });
  return out;
}

/// Runs the pickle at `pos` and hands its value to `check` (values live in the reader's arena);
/// `pos` moves past it.
void next_pickle(const detail::MappedFile& map, const std::string& path, size_t& pos,
                 const std::function<void(const Value*)>& check) {
  std::vector<detail::PickledStorage> none;
  Reader reader(path, map.data(), map.size(), pos, none);
  check(reader.run());
  pos = reader.pos();
}

/// Checks the magic number, the protocol version and the system information of a legacy file
/// and returns where the saved object's pickle starts.
size_t legacy_object_start(const detail::MappedFile& map, const std::string& path) {
  size_t pos = sizeof kLegacyMagic;
  next_pickle(map, path, pos, [&](const Value* version) {
    if (version->kind != Value::Kind::kInt || version->i != 1001) {
      throw detail::malformed_file(path, "a legacy torch.save file of an unknown protocol version");
    }
  });
  next_pickle(map, path, pos, [&](const Value* info) {
    const Value* little =
        info->kind == Value::Kind::kDict ? find_entry(info, "little_endian") : nullptr;
    if (little && little->kind == Value::Kind::kBool && !little->i) {
      throw Error(ErrorCode::kUnsupported, "",
                  path + ": a big-endian legacy torch.save file, which wrapcert does not read");
    }
  });
  return pos;
}

TorchSaveFile read_legacy(detail::InputFile& file, const TorchSaveOptions& options) {
  const std::string& path = file.path();
  const detail::MappedFile map(file);
  size_t pos = legacy_object_start(map, path);
  auto pickled =
      detail::read_state_dict_pickle(map.data() + pos, map.size() - pos, path, options.entry);
  pos += pickled.end;
  std::vector<std::string> order;
  next_pickle(map, path, pos, [&](const Value* keys) {
    if (keys->kind != Value::Kind::kList)
      throw detail::malformed_file(path, "the storage key list is missing");
    for (const auto* k : keys->items) {
      if (k->kind != Value::Kind::kString)
        throw detail::malformed_file(path, "a storage key that is not a string");
      order.push_back(k->s);
    }
  });
  // Where each storage's bytes lie: its count is checked, its data is not read.
  std::unordered_map<std::string, size_t> index;
  for (size_t s = 0; s < pickled.storages.size(); ++s) index.emplace(pickled.storages[s].key, s);
  std::vector<uint64_t> offset(pickled.storages.size(), 0);
  std::vector<bool> seen(pickled.storages.size(), false);
  for (const auto& key : order) {
    const auto it = index.find(key);
    if (it == index.end() || seen[it->second]) {
      throw detail::malformed_file(
          path, "the storage key list names storage " + key +
                    (it == index.end() ? ", which the pickle does not" : " twice"));
    }
    const auto& s = pickled.storages[it->second];
    uint64_t count = 0;
    if (map.size() - pos < 8)
      throw detail::malformed_file(path, "the file ends before storage " + key);
    for (int b = 7; b >= 0; --b)
      count = (count << 8) | static_cast<unsigned char>(map.data()[pos + b]);
    if (count != static_cast<uint64_t>(s.numel)) {
      throw detail::malformed_file(path, "storage " + key + " holds " + std::to_string(count) +
                                             " elements, not " + std::to_string(s.numel));
    }
    const uint64_t bytes = count * c10::elementSize(s.dtype);
    if (map.size() - pos - 8 < bytes)
      throw detail::malformed_file(path, "the file ends inside storage " + key);
    offset[it->second] = pos + 8;
    seen[it->second] = true;
    pos += 8 + bytes;
  }
  for (size_t s = 0; s < seen.size(); ++s) {
    if (!seen[s])
      throw detail::malformed_file(path,
                                   "the file lacks the data of storage " + pickled.storages[s].key);
  }
  if (pos != map.size()) {
    throw detail::malformed_file(
        path, std::to_string(map.size() - pos) + " bytes follow the last storage");
  }
  TorchSaveFile out{StateDict(), "torch.save legacy", pickled.entry, pickled.other_entries,
                    pickled.more_state_dicts};
  out.state = !options.data ? std::move(pickled.state)
                            : with_data(pickled, [&](size_t s, torch::Tensor& t) {
                                if (t.nbytes()) {
                                  std::memcpy(t.data_ptr(), map.data() + offset[s], t.nbytes());
                                }
                              });
  return out;
}

}  // namespace

TorchSaveFile read_torch_save(const std::string& path, const TorchSaveOptions& options) {
  detail::InputFile file(path);
  static constexpr unsigned char kZip[] = {'P', 'K', 3, 4};
  if (starts_with(file, kZip, sizeof kZip)) return read_zip(file, options);
  if (starts_with(file, kLegacyMagic, sizeof kLegacyMagic)) return read_legacy(file, options);
  static constexpr unsigned char kTar[] = {'u', 's', 't', 'a', 'r'};
  if (file.size() > 262) {
    unsigned char tar[5];
    file.read_at(257, tar, 5);
    if (std::memcmp(tar, kTar, 5) == 0) {
      throw Error(ErrorCode::kUnsupported, "",
                  path +
                      ": the tar torch.save format of PyTorch before 0.4, which wrapcert does not "
                      "read; load it in Python and save it again");
    }
  }
  throw detail::malformed_file(
      path,
      "not a torch.save file (neither the zip archive of PyTorch >= 1.6 nor the legacy "
      "format)");
}

StateDict load_torch_save(const std::string& path) {
  return read_torch_save(path).state;
}

namespace {

/// What `torch.save` pickles for a state dict, in Python's protocol 2, written by hand: the
/// pickle libraries for C++ write other shapes (LibTorch's tags its dicts with
/// `torch.jit._pickle.restore_type_tag`, which `torch.load(weights_only=True)` refuses).
///   OrderedDict([(key, _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()))])
/// where each storage is a persistent id ('storage', torch.FloatStorage, '0', 'cpu', numel).
class StateDictPickler {
 public:
  StateDictPickler() {
    out_ += "\x80\x02";  // PROTO 2
    ordered_dict();
  }

  void begin_items() { out_ += '('; }  // MARK; SETITEMS closes it
  void end_items() { out_ += 'u'; }
  void tensor(const std::string& key, const std::string& storage_key, const char* storage_type,
              int64_t storage_numel, const at::Tensor& t) {
    string(key);
    global("torch._utils", "_rebuild_tensor_v2");
    out_ += '(';
    out_ += '(';  // the persistent id, a tuple of five
    string("storage");
    global("torch", storage_type);
    string(storage_key);
    string("cpu");
    integer(storage_numel);
    out_ += 't';
    out_ += 'Q';  // BINPERSID
    integer(t.storage_offset());
    ints(t.sizes());
    ints(t.strides());
    out_ += '\x89';  // False: requires_grad
    ordered_dict();  // backward hooks
    out_ += 't';
    out_ += 'R';
  }
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }

 private:
  void global(const char* module, const char* name) {
    out_ += 'c';
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void ordered_dict() {
    global("collections", "OrderedDict");
    out_ += ')';
    out_ += 'R';
  }
  void little_endian(uint64_t v, int n) {
    for (int b = 0; b < n; ++b) out_ += static_cast<char>((v >> (8 * b)) & 0xff);
  }
  void string(const std::string& s) {
    out_ += 'X';
    little_endian(s.size(), 4);
    out_ += s;
  }
  /// As Python's pickler writes an int: BININT1, BININT2, BININT, else LONG1.
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      little_endian(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      little_endian(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      little_endian(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
    } else {  // two's complement, as few bytes as hold the sign
      int n = 1;
      while (n < 8 && (v >> (8 * n - 1)) != 0 && (v >> (8 * n - 1)) != -1) ++n;
      out_ += '\x8a';
      out_ += static_cast<char>(n);
      little_endian(static_cast<uint64_t>(v), n);
    }
  }
  void ints(c10::IntArrayRef values) {
    if (values.empty()) {
      out_ += ')';
      return;
    }
    if (values.size() > 3) out_ += '(';
    for (const auto v : values) integer(v);
    out_ += values.size() > 3 ? 't' : static_cast<char>(0x84 + values.size());  // TUPLE1..3
  }

  std::string out_;
};

const char* storage_type_name(c10::ScalarType dtype) {
  for (const auto& [name, type] : storage_types()) {
    if (type == dtype) return name.c_str() + name.find(' ') + 1;
  }
  return nullptr;
}

/// Writes records through LibTorch's own archive writer, the one behind Python's `torch.save`
/// (64-byte aligned, uncompressed, a `version` record at the end), into `out`. A write that
/// fails leaves `out` failed; the writer is never made to throw from its destructor.
class ArchiveWriter {
 public:
  explicit ArchiveWriter(std::ostream& out)
      : writer_([&out](const void* data, size_t n) {
          out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
          return n;  // a failed stream is seen by the caller, after the archive ends
        }) {}
  void record(const std::string& name, const void* data, size_t n) {
    try {
      writer_.writeRecord(name, data, n);
    } catch (const c10::Error& e) {
      throw Error(ErrorCode::kInvalidArgument, name, e.what_without_backtrace());
    }
  }
  void finish(uint64_t version) {
    writer_.setMinVersion(version);
    writer_.writeEndOfFile();
  }

 private:
  caffe2::serialize::PyTorchStreamWriter writer_;
};

/// Each entry's state dict in the pickle at `data`, and the pickle with their keys renamed.
std::pair<std::string, size_t> renamed_pickle(const char* data, size_t size,
                                              const std::string& path,
                                              const std::vector<EntryRenames>& entries) {
  std::vector<detail::PickledStateDict> pickled;
  pickled.reserve(entries.size());
  std::vector<std::pair<const detail::PickledStateDict*, const detail::KeyRenames*>> parts;
  for (const auto& e : entries) {
    pickled.push_back(detail::read_state_dict_pickle(data, size, path, e.entry));
    parts.emplace_back(&pickled.back(), &e.renames);
  }
  return {detail::rename_pickled_keys(data, parts, path), pickled.front().end};
}

void rewrite_zip(detail::InputFile& file, const std::string& destination,
                 const std::vector<EntryRenames>& entries) {
  const std::string path = file.path();
  ZipArchive archive(file);
  const auto pickle = archive.read_all("data.pkl");
  // Not a structured binding: the lambda below captures it, which C++17 does not allow.
  auto result = renamed_pickle(pickle.data(), pickle.size(), path, entries);
  std::string& renamed = result.first;
  renamed.append(pickle, result.second, std::string::npos);
  const auto names = archive.names();
  write_file_atomically(destination, [&](std::ostream& out) {
    ArchiveWriter writer(out);
    uint64_t version = caffe2::serialize::kMinProducedFileFormatVersion;
    for (const auto& name : names) {
      if (name == "data.pkl") {
        writer.record(name, renamed.data(), renamed.size());
      } else if (name == "version" || name == ".data/version") {
        // The writer adds its own; a newer file's version is kept.
        const auto text = archive.read_all(name);
        char* end = nullptr;
        const auto v = std::strtoull(text.c_str(), &end, 10);
        if (end == text.c_str())
          throw detail::malformed_file(path, "record " + name + " holds no version number");
        version = std::max<uint64_t>(version, v);
      } else if (!name.empty() && name.back() != '/') {  // folders are implied by their records
        const auto bytes = archive.read_all(name);       // one record in memory at a time
        writer.record(name, bytes.data(), bytes.size());
      }
    }
    writer.finish(version);
  });
}

void rewrite_legacy(detail::InputFile& file, const std::string& destination,
                    const std::vector<EntryRenames>& entries) {
  const std::string& path = file.path();
  const detail::MappedFile map(file);
  const size_t start = legacy_object_start(map, path);
  // Not a structured binding: the lambda below captures it, which C++17 does not allow.
  const auto result = renamed_pickle(map.data() + start, map.size() - start, path, entries);
  const std::string& renamed = result.first;
  const size_t rest = start + result.second;
  write_file_atomically(destination, [&](std::ostream& out) {
    out.write(map.data(), static_cast<std::streamsize>(start));
    out.write(renamed.data(), static_cast<std::streamsize>(renamed.size()));
    out.write(map.data() + rest, static_cast<std::streamsize>(map.size() - rest));
  });
}

}  // namespace

void rewrite_torch_save(const std::string& source, const std::string& destination,
                        const std::vector<std::pair<std::string, std::string>>& renames,
                        const std::string& entry) {
  rewrite_torch_save(source, destination, std::vector<EntryRenames>{{entry, renames}});
}

void rewrite_torch_save(const std::string& source, const std::string& destination,
                        const std::vector<EntryRenames>& entries) {
  if (entries.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "", source + ": no state dict named to rewrite");
  }
  detail::InputFile file(source);
  static constexpr unsigned char kZip[] = {'P', 'K', 3, 4};
  if (starts_with(file, kZip, sizeof kZip)) return rewrite_zip(file, destination, entries);
  if (starts_with(file, kLegacyMagic, sizeof kLegacyMagic)) {
    return rewrite_legacy(file, destination, entries);
  }
  (void)read_torch_save(source, {false, entries.front().entry});  // names what the file is
  throw detail::malformed_file(source, "not a torch.save file");
}

void save_torch_save(const std::string& path, const StateDict& state) {
  // One storage per distinct storage of the state dict, as `torch.save` keeps ties and views.
  struct Storage {
    std::string key;
    const char* type;
    int64_t numel;
    at::Tensor owner;  // keeps the data alive and gives its bytes
  };
  std::vector<Storage> storages;
  std::unordered_map<const void*, size_t> index;
  StateDictPickler pickler;
  pickler.begin_items();
  for (const auto& item : state) {
    if (!item.value().defined()) {
      throw Error(ErrorCode::kUnsupported, item.key(),
                  "a module's extra state that is not a tensor: only a copy of the torch.save "
                  "file that holds it keeps it");
    }
    if (item.value().is_meta()) {
      throw Error(ErrorCode::kInvalidArgument, item.key(),
                  "a tensor on the meta device has no data to save");
    }
    const auto t = item.value().is_cpu() ? item.value().detach() : item.value().detach().cpu();
    const char* type = storage_type_name(t.scalar_type());
    if (!type) {
      throw Error(ErrorCode::kInvalidArgument, item.key(),
                  std::string("torch.save has no storage type for dtype ") +
                      c10::toString(t.scalar_type()));
    }
    const void* impl = t.storage().unsafeGetStorageImpl();
    auto [it, fresh] = index.emplace(impl, storages.size());
    if (fresh) {
      const auto bytes = static_cast<int64_t>(t.storage().nbytes());
      storages.push_back({std::to_string(storages.size()), type,
                          bytes / static_cast<int64_t>(t.element_size()), t});
    } else if (storages[it->second].type != type) {
      throw Error(ErrorCode::kInvalidArgument, item.key(),
                  "shares its storage with a tensor of another dtype, which torch.save refuses");
    }
    const auto& s = storages[it->second];
    pickler.tensor(item.key(), s.key, s.type, s.numel, t);
  }
  pickler.end_items();
  const auto pickle = pickler.finish();
  write_file_atomically(path, [&](std::ostream& out) {
    ArchiveWriter writer(out);
    writer.record("data.pkl", pickle.data(), pickle.size());
    for (const auto& s : storages) {
      writer.record("data/" + s.key, s.owner.storage().data(), s.owner.storage().nbytes());
    }
    writer.finish(caffe2::serialize::kMinProducedFileFormatVersion);
  });
}

}  // namespace wrapcert
