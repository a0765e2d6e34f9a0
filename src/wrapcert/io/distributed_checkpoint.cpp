#include <wrapcert/error.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/pickle_machine.h>
#include <wrapcert/io/distributed_checkpoint.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;
using Kind = detail::Value::Kind;
using detail::Value;

constexpr uint64_t kMaxMetadata = uint64_t{1} << 32;
constexpr const char* kDcpMetadata = "torch.distributed.checkpoint.metadata ";

/// A dtype as `torch.float32` pickles: the global "torch float32".
std::optional<c10::ScalarType> dtype_named(const std::string& global) {
  static const std::map<std::string, c10::ScalarType> table = {
      {"torch float32", c10::kFloat},
      {"torch float64", c10::kDouble},
      {"torch float16", c10::kHalf},
      {"torch bfloat16", c10::kBFloat16},
      {"torch int64", c10::kLong},
      {"torch int32", c10::kInt},
      {"torch int16", c10::kShort},
      {"torch int8", c10::kChar},
      {"torch uint8", c10::kByte},
      {"torch bool", c10::kBool},
      {"torch complex64", c10::kComplexFloat},
      {"torch complex128", c10::kComplexDouble}};
  const auto it = table.find(global);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

/// The classes and functions a DCP `.metadata` names (PyTorch 2.0 to 2.5), and nothing else: a
/// pickle naming another is refused before any of its values is looked at.
bool allowed_global(const std::string& name) {
  static const std::set<std::string> names = [] {
    std::set<std::string> out = {
        "torch Size",
        "torch.serialization _get_layout",
        "torch strided",
        "builtins getattr",  // an enum member by name (Python 3.11.0-3.11.4)
        "collections OrderedDict",
        "torch.distributed._shard.sharded_tensor.metadata TensorProperties",
        "torch.distributed._shard.sharded_tensor.metadata MEM_FORMAT_ENCODING",
        "torch.distributed.checkpoint.filesystem _StorageInfo",
        "torch.distributed._shard.checkpoint.filesystem _StorageInfo"};
    for (const char* module : {"torch.distributed.checkpoint.metadata",
                               "torch.distributed._shard.checkpoint.metadata"}) {
      for (const char* cls :
           {"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
            "MetadataIndex", "TensorProperties", "_MEM_FORMAT_ENCODING", "StorageMeta"}) {
        out.insert(std::string(module) + " " + cls);
      }
    }
    return out;
  }();
  return names.count(name) > 0 || dtype_named(name).has_value();
}

/// The class of a DCP object, without its module ("Metadata"), or "" for anything else.
std::string dcp_class(const Value* v) {
  if (v->kind != Kind::kObject) return "";
  const auto space = v->s.rfind(' ');
  return space == std::string::npos ? "" : v->s.substr(space + 1);
}

/// The metadata pickle, run, with what it names checked against the allow-list.
class MetadataPickle {
 public:
  MetadataPickle(const std::string& path) : path_(path) {
    const detail::InputFile in(path);
    if (in.size() > kMaxMetadata) throw detail::malformed_file(path, "a .metadata over 4 GiB");
    bytes_.resize(in.size());
    in.read_at(0, bytes_.data(), bytes_.size());
    reader_.emplace(path, bytes_.data(), bytes_.size(), 0, no_storages_);
    root_ = reader_->run();
    for (const auto& name : reader_->globals()) {
      if (!allowed_global(name)) {
        fail("", "names '" + name +
                     "', which torch.distributed.checkpoint does not write; wrapcert reads only "
                     "its own classes from a .metadata");
      }
    }
    if (dcp_class(root_) != "Metadata" || !root_->state) {
      fail("", "holds " +
                   std::string(root_->kind == Kind::kObject ? "an object of '" + root_->s + "'"
                                                            : "no Metadata") +
                   ", not torch.distributed.checkpoint's Metadata");
    }
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw detail::malformed_file(path_, what, key);
  }
  const std::string& bytes() const { return bytes_; }
  const Value* root() const { return root_; }
  const std::vector<size_t>& frames() const { return reader_->frames(); }
  size_t end() const { return reader_->pos(); }

  /// A dataclass's field: its state dict's entry `name`, or nullptr.
  static const Value* field(const Value* object, const std::string& name) {
    if (!object || object->kind != Kind::kObject || !object->state ||
        object->state->kind != Kind::kDict) {
      return nullptr;
    }
    for (const auto& [k, v] : object->state->dict) {
      if (k->kind == Kind::kString && k->s == name) return v;
    }
    return nullptr;
  }

  /// A `torch.Size` (or a tuple) of non-negative integers.
  std::vector<int64_t> size_of(const Value* v, const std::string& key, const char* what) const {
    const Value* tuple = v;
    if (v && v->kind == Kind::kObject && v->s == "torch Size" && v->args &&
        v->args->kind == Kind::kTuple && v->args->items.size() == 1) {
      tuple = v->args->items[0];
    }
    if (!tuple || (tuple->kind != Kind::kTuple && tuple->kind != Kind::kList)) {
      fail(key, std::string(what) + " that is not a torch.Size");
    }
    std::vector<int64_t> out;
    for (const auto* d : tuple->items) {
      if (d->kind != Kind::kInt || d->i < 0) {
        fail(key, std::string(what) + " with an entry that is not a non-negative integer");
      }
      out.push_back(d->i);
    }
    return out;
  }

 private:
  std::string path_;
  std::string bytes_;
  std::vector<detail::PickledStorage> no_storages_;
  std::optional<detail::Reader> reader_;
  const Value* root_ = nullptr;
};

struct Item {  // one chunk's bytes: in `file`, [offset, offset + length)
  std::string file;
  uint64_t offset = 0, length = 0;
};

/// Everything `read_distributed_checkpoint` checks, and where each key's strings are.
struct Parsed {
  struct Key {
    std::string fqn;
    const Value* metadata = nullptr;  // TensorStorageMetadata or BytesStorageMetadata
    std::vector<std::string> path;    // the planner's path to it in the nested state dict
    bool has_path = false;
  };
  std::vector<Key> keys;  // in saved order
  std::unordered_map<std::string, std::vector<Item>> items;
  std::vector<std::string> files;  // in name order
};

uint64_t numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return UINT64_MAX;
  }
  return n;
}

Parsed parse(const MetadataPickle& pickle, const std::string& folder) {
  Parsed out;
  const auto* sd = MetadataPickle::field(pickle.root(), "state_dict_metadata");
  if (!sd || sd->kind != Kind::kDict) pickle.fail("", "the Metadata has no state_dict_metadata");
  std::unordered_map<std::string, size_t> index;
  for (const auto& [k, v] : sd->dict) {
    if (k->kind != Kind::kString) pickle.fail("", "a key of state_dict_metadata is no string");
    const auto cls = dcp_class(v);
    if (cls != "TensorStorageMetadata" && cls != "BytesStorageMetadata") {
      pickle.fail(k->s,
                  "the key's metadata is neither TensorStorageMetadata nor "
                  "BytesStorageMetadata");
    }
    if (!index.emplace(k->s, out.keys.size()).second) pickle.fail(k->s, "the key is saved twice");
    out.keys.push_back({k->s, v, {}, false});
  }
  // The planner's key mapping: each key's path in the nested state dict that was saved.
  if (const auto* planner = MetadataPickle::field(pickle.root(), "planner_data");
      planner && planner->kind == Kind::kDict) {
    for (const auto& [k, v] : planner->dict) {
      if (k->kind != Kind::kString || v->kind != Kind::kTuple) continue;
      const auto it = index.find(k->s);
      if (it == index.end()) continue;
      auto& key = out.keys[it->second];
      key.has_path = true;
      for (const auto* part : v->items) {
        key.path.push_back(part->kind == Kind::kString ? part->s
                           : part->kind == Kind::kInt  ? std::to_string(part->i)
                                                       : "?");
      }
    }
  }
  // Where each chunk's bytes lie.
  const auto* storage = MetadataPickle::field(pickle.root(), "storage_data");
  if (!storage || storage->kind != Kind::kDict) {
    pickle.fail("", "the Metadata has no storage_data (where each chunk's bytes lie)");
  }
  std::map<std::string, uint64_t> extent;  // file -> the end of its last item
  for (const auto& [k, v] : storage->dict) {
    const auto* fqn = MetadataPickle::field(k, "fqn");
    if (dcp_class(k) != "MetadataIndex" || !fqn || fqn->kind != Kind::kString) {
      pickle.fail("", "a key of storage_data is no MetadataIndex");
    }
    if (!index.count(fqn->s)) {
      pickle.fail(fqn->s, "storage_data places a chunk of a key state_dict_metadata lacks");
    }
    const auto* file = MetadataPickle::field(v, "relative_path");
    const auto* offset = MetadataPickle::field(v, "offset");
    const auto* length = MetadataPickle::field(v, "length");
    if (dcp_class(v) != "_StorageInfo" || !file || file->kind != Kind::kString || !offset ||
        offset->kind != Kind::kInt || offset->i < 0 || !length || length->kind != Kind::kInt ||
        length->i < 0) {
      pickle.fail(fqn->s, "a chunk's _StorageInfo lacks its file, offset or length");
    }
    const auto& name = file->s;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      pickle.fail(fqn->s, "a chunk lies in '" + name + "', not a file of the folder");
    }
    Item item{name, static_cast<uint64_t>(offset->i), static_cast<uint64_t>(length->i)};
    auto& end = extent[name];
    end = std::max(end, item.offset + item.length);
    out.items[fqn->s].push_back(item);
  }
  for (const auto& [name, end] : extent) {
    const auto path = (fs::path(folder) / name).string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw detail::malformed_file(
          path,
          "the .metadata places chunks in it, but it is " +
              std::string(::lstat(path.c_str(), &st) != 0 ? "missing" : "not a regular file"));
    }
    if (static_cast<uint64_t>(st.st_size) < end) {
      throw detail::malformed_file(
          path, "the file is " + std::to_string(st.st_size) +
                    " bytes, shorter than the .metadata says: a chunk ends at byte " +
                    std::to_string(end));
    }
    out.files.push_back(name);
  }
  // Every tensor's chunks lie inside it, cover it, and each has its bytes.
  for (const auto& key : out.keys) {
    const auto& chunks_of = out.items[key.fqn];
    if (dcp_class(key.metadata) == "BytesStorageMetadata") {
      if (chunks_of.empty()) pickle.fail(key.fqn, "storage_data has no bytes for the key");
      continue;
    }
    const auto shape =
        pickle.size_of(MetadataPickle::field(key.metadata, "size"), key.fqn, "a size");
    const auto* chunks = MetadataPickle::field(key.metadata, "chunks");
    if (!chunks || chunks->kind != Kind::kList) pickle.fail(key.fqn, "a tensor without chunks");
    uint64_t covered = 0;
    for (const auto* chunk : chunks->items) {
      const auto offsets =
          pickle.size_of(MetadataPickle::field(chunk, "offsets"), key.fqn, "a chunk's offsets");
      const auto sizes =
          pickle.size_of(MetadataPickle::field(chunk, "sizes"), key.fqn, "a chunk's sizes");
      if (offsets.size() != shape.size() || sizes.size() != shape.size()) {
        pickle.fail(key.fqn, "a chunk of another rank than its tensor's");
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        if (offsets[d] > shape[d] || sizes[d] > shape[d] - offsets[d]) {
          pickle.fail(key.fqn,
                      "a chunk reaches outside its tensor (dimension " + std::to_string(d) + ")");
        }
      }
      covered += numel_of(sizes);
    }
    if (covered != numel_of(shape)) {
      pickle.fail(key.fqn, "the chunks hold " + std::to_string(covered) + " of the tensor's " +
                               std::to_string(numel_of(shape)) + " elements");
    }
    if (chunks_of.size() != chunks->items.size()) {
      pickle.fail(key.fqn, "storage_data places " + std::to_string(chunks_of.size()) +
                               " chunks of the key, whose metadata lists " +
                               std::to_string(chunks->items.size()));
    }
  }
  return out;
}

const std::vector<std::string>& usual_entries() {
  static const std::vector<std::string> names = {"state_dict", "model", "module",
                                                 "model_state_dict"};
  return names;
}

/// The entry of a nested state dict to read, and whether the keys are nested at all.
std::string choose_entry(const Parsed& parsed, const std::string& entry, const std::string& path) {
  std::vector<std::string> tops;  // in saved order
  std::unordered_set<std::string> seen;
  bool nested = false;
  for (const auto& key : parsed.keys) {
    if (key.path.size() > 1) nested = true;
    const auto& top = key.path.empty() ? key.fqn : key.path.front();
    if (seen.insert(top).second) tops.push_back(top);
  }
  if (!entry.empty()) {
    if (!nested || !seen.count(entry)) {
      std::string names;
      for (const auto& t : tops) names += (names.empty() ? "" : ", ") + t;
      throw detail::malformed_file(path, "no entry '" + entry + "' (entries: " + names + ")",
                                   entry);
    }
    return entry;
  }
  if (!nested) return "";
  for (const auto& name : usual_entries()) {
    if (seen.count(name)) return name;
  }
  return "";
}

/// The key a saved key has when `entry` is read: its path less the entry, joined.
std::string key_in(const Parsed::Key& key, const std::string& entry) {
  if (entry.empty()) return key.fqn;
  std::string out;
  for (size_t p = 1; p < key.path.size(); ++p) out += (p > 1 ? "." : "") + key.path[p];
  return out;
}

bool in_entry(const Parsed::Key& key, const std::string& entry) {
  return entry.empty() || (key.path.size() > 1 && key.path.front() == entry);
}

c10::ScalarType dtype_of(const MetadataPickle& pickle, const Parsed::Key& key) {
  const auto* props = MetadataPickle::field(key.metadata, "properties");
  const Value* dtype = nullptr;
  if (props && props->kind == Kind::kObject && props->state) {
    if (props->state->kind == Kind::kTuple && !props->state->items.empty()) {
      dtype = props->state->items[0];  // (dtype, layout, requires_grad, memory format, pinned)
    } else {
      dtype = MetadataPickle::field(props, "dtype");
    }
  }
  if (!dtype || dtype->kind != Kind::kGlobal || !dtype_named(dtype->s)) {
    pickle.fail(key.fqn, "a tensor whose properties name no dtype wrapcert knows");
  }
  return *dtype_named(dtype->s);
}

}  // namespace

DistributedCheckpoint read_distributed_checkpoint(const std::string& folder,
                                                  const std::string& entry) {
  const auto metadata = (fs::path(folder) / ".metadata").string();
  struct stat st {};
  if (::lstat(metadata.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument, "",
                metadata + ": a torch.distributed.checkpoint folder needs its .metadata file");
  }
  const MetadataPickle pickle(metadata);
  const auto parsed = parse(pickle, folder);
  DistributedCheckpoint out;
  out.metadata = metadata;
  out.entry = choose_entry(parsed, entry, metadata);
  std::unordered_map<std::string, std::vector<std::string>> keys_in_file;
  std::unordered_set<std::string> others;
  for (const auto& key : parsed.keys) {
    if (!in_entry(key, out.entry)) {
      const auto& top = key.path.front();
      if (others.insert(top).second) out.other_entries.push_back(top);
      continue;
    }
    const auto name = key_in(key, out.entry);
    if (out.state.contains(name)) pickle.fail(name, "the key is saved twice");
    if (dcp_class(key.metadata) == "BytesStorageMetadata") {
      out.state.insert(name, torch::Tensor());
    } else {
      const auto shape =
          pickle.size_of(MetadataPickle::field(key.metadata, "size"), key.fqn, "a size");
      out.state.insert(
          name, torch::empty(
                    shape, torch::TensorOptions().dtype(dtype_of(pickle, key)).device(c10::kMeta)));
    }
    for (const auto& item : parsed.items.at(key.fqn)) {
      auto& names = keys_in_file[item.file];
      if (names.empty() || names.back() != name) names.push_back(name);
    }
  }
  for (const auto& file : parsed.files) {
    out.files.emplace_back((fs::path(folder) / file).string(), keys_in_file[file]);
  }
  return out;
}

namespace {

/// Every reference to a string in the pickle's values, counted from the root (each container
/// walked once): how often the pickle uses each string value it built.
std::unordered_map<const Value*, size_t> string_references(const Value* root) {
  std::unordered_map<const Value*, size_t> refs;
  std::unordered_set<const Value*> seen;
  std::vector<const Value*> todo = {root};
  auto visit = [&](const Value* v) {
    if (!v) return;
    if (v->kind == Kind::kString) {
      ++refs[v];
    } else if (seen.insert(v).second) {
      todo.push_back(v);
    }
  };
  seen.insert(root);
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    for (const auto* item : v->items) visit(item);
    for (const auto& [k, value] : v->dict) {
      visit(k);
      visit(value);
    }
    visit(v->state);
    visit(v->args);
  }
  return refs;
}

}  // namespace

void write_renamed_distributed_checkpoint(
    const std::string& source, const std::string& destination, const std::string& entry,
    const std::vector<std::pair<std::string, std::string>>& renames,
    const std::function<void(const std::string&)>& on_file) {
  const auto metadata = (fs::path(source) / ".metadata").string();
  const MetadataPickle pickle(metadata);
  const auto parsed = parse(pickle, source);
  const auto chosen = choose_entry(parsed, entry, metadata);
  const std::unordered_map<std::string, std::string> to(renames.begin(), renames.end());
  // What each string of a key becomes: the saved key (fqn) whole, and the last part of its path.
  std::unordered_map<std::string, std::string> fqn_to, tail_to;
  for (const auto& key : parsed.keys) {
    if (!in_entry(key, chosen)) continue;
    const auto name = key_in(key, chosen);
    const auto it = to.find(name);
    if (it == to.end() || it->second == name) continue;
    const auto prefix = key.fqn.substr(0, key.fqn.size() - name.size());  // "model."
    fqn_to[key.fqn] = prefix + it->second;
    if (key.path.size() > 1) {
      const auto& tail = key.path.back();
      const auto outer = name.size() - std::min(name.size(), tail.size());  // "a." of "a.tail"
      if (name.compare(outer, std::string::npos, tail) != 0 ||
          it->second.compare(0, outer, name, 0, outer) != 0) {
        throw Error(ErrorCode::kUnsupported, name,
                    metadata + ": the key lies in nested entries that the translation to '" +
                        it->second +
                        "' renames; wrapcert renames only the last part of a nested key");
      }
      const auto [at, fresh] = tail_to.emplace(tail, it->second.substr(outer));
      if (!fresh && at->second != it->second.substr(outer)) {
        throw Error(ErrorCode::kUnsupported, name,
                    metadata + ": two keys end in '" + tail +
                        "' renamed differently; wrapcert leaves this checkpoint as it is");
      }
    }
  }
  // The strings in the places that spell keys, each with what it becomes.
  std::unordered_map<const Value*, std::string> edits;
  std::unordered_map<const Value*, size_t> role_refs;
  auto spell = [&](const Value* v, const std::unordered_map<std::string, std::string>& map) {
    if (!v || v->kind != Kind::kString) return;
    ++role_refs[v];
    if (const auto it = map.find(v->s); it != map.end()) edits[v] = it->second;
  };
  const auto* sd = MetadataPickle::field(pickle.root(), "state_dict_metadata");
  for (const auto& [k, v] : sd->dict) spell(k, fqn_to);
  if (const auto* planner = MetadataPickle::field(pickle.root(), "planner_data");
      planner && planner->kind == Kind::kDict) {
    for (const auto& [k, v] : planner->dict) {
      spell(k, fqn_to);
      if (v->kind != Kind::kTuple || v->items.empty()) continue;
      // A path of one part is the key itself; else its last part is the tail.
      spell(v->items.back(), v->items.size() == 1 ? fqn_to : tail_to);
    }
  }
  for (const auto& [k, v] : MetadataPickle::field(pickle.root(), "storage_data")->dict) {
    spell(MetadataPickle::field(k, "fqn"), fqn_to);
  }
  // A string renamed here must not also be used elsewhere in the pickle (a field's name).
  const auto refs = string_references(pickle.root());
  for (const auto& [v, bytes] : edits) {
    if (refs.at(v) != role_refs[v]) {
      throw Error(ErrorCode::kUnsupported, v->s,
                  metadata +
                      ": the pickle uses the key's string for something else too; "
                      "renaming it would change that, so wrapcert leaves this checkpoint "
                      "as it is");
    }
  }
  struct Edit {
    size_t begin, end;
    std::string bytes;
  };
  std::vector<Edit> spans;
  for (size_t f : pickle.frames()) spans.push_back({f, f + 9, ""});  // frames' lengths change
  for (const auto& [v, text] : edits) {
    std::string op(5, 'X');  // BINUNICODE: a 4-byte little-endian length, then UTF-8
    const auto n = static_cast<uint32_t>(text.size());
    for (int b = 0; b < 4; ++b) op[1 + b] = static_cast<char>((n >> (8 * b)) & 0xff);
    spans.push_back({v->begin, v->end, op + text});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  const auto& bytes = pickle.bytes();
  std::string renamed;
  renamed.reserve(bytes.size() + 64 * spans.size());
  size_t at = 0;
  for (const auto& e : spans) {
    renamed.append(bytes, at, e.begin - at);
    renamed += e.bytes;
    at = e.end;
  }
  renamed.append(bytes, at, std::string::npos);

  std::error_code error;
  const bool in_place = fs::equivalent(source, destination, error);
  if (!in_place) {
    // A new folder only: the old .metadata would name other bytes while the .distcp change.
    for (const auto& name : [&] {
           auto names = parsed.files;
           names.push_back(".metadata");
           return names;
         }()) {
      struct stat st {};
      const auto path = (fs::path(destination) / name).string();
      if (::lstat(path.c_str(), &st) == 0) {
        throw Error(ErrorCode::kInvalidArgument, "",
                    path +
                        ": exists; a torch.distributed.checkpoint is written to a folder that "
                        "holds none (or in place, with --in-place)");
      }
    }
    for (const auto& name : parsed.files) {
      const auto path = (fs::path(destination) / name).string();
      const detail::InputFile in((fs::path(source) / name).string());
      write_file_atomically(path, [&](std::ostream& out) {
        std::string block(size_t{1} << 20, '\0');
        for (uint64_t done = 0; done < in.size();) {
          const auto n = static_cast<size_t>(std::min<uint64_t>(block.size(), in.size() - done));
          in.read_at(done, block.data(), n);
          out.write(block.data(), static_cast<std::streamsize>(n));
          done += n;
        }
      });
      if (on_file) on_file(path);
    }
  }
  const auto path = (fs::path(destination) / ".metadata").string();
  write_file_atomically(path, renamed);
  if (on_file) on_file(path);
}

}  // namespace wrapcert
