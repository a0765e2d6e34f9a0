#include <wrapcert/error.h>
#include <wrapcert/io/checkpoint_file.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/saved_identity.h>
#include <wrapcert/io/detail/scratch.h>
#include <wrapcert/io/detail/strict_json.h>
#include <wrapcert/io/detail/tar_archive.h>
#include <wrapcert/io/distributed_checkpoint.h>
#include <wrapcert/io/safetensors.h>
#include <wrapcert/io/torch_save.h>
#include <wrapcert/state_dict.h>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

namespace wrapcert {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, path, what);
}

constexpr uint64_t kMaxIndex = uint64_t{100} * 1024 * 1024;

Checkpoint read_archive(const std::string& path, const CheckpointReadOptions& options);

/// One file, by its content: safetensors starts with a header length and '{', a tar archive
/// has "ustar" at byte 257 (gzipped: the gzip magic).
Checkpoint read_file(const std::string& path, const CheckpointReadOptions& options,
                     bool archives = true) {
  Checkpoint out;
  bool safetensors = false;
  bool torch_save = false;
  {
    const detail::InputFile in(path);
    unsigned char head[9] = {};
    if (in.size() >= 9) in.read_at(0, head, 9);
    safetensors = in.size() >= 9 && head[8] == '{';
    // torch.save's zip and legacy formats by their first bytes, before a tar's magic is looked
    // for further in (a key's bytes could spell it).
    torch_save = (head[0] == 'P' && head[1] == 'K') || head[0] == 0x80;
  }
  if (archives && !safetensors && !torch_save && detail::looks_like_tar(path)) {
    return read_archive(path, options);
  }
  if (safetensors) {
    if (!options.entry.empty()) {
      throw Error(ErrorCode::kInvalidArgument, options.entry,
                  path + ": a safetensors file has no nested entries");
    }
    out.state = options.data ? load_safetensors(path) : list_safetensors(path);
    out.format = "safetensors";
  } else {
    auto saved = read_torch_save(path, {options.data, options.entry});
    out.state = std::move(saved.state);
    out.format = saved.format;
    out.entry = saved.entry;
    out.other_entries = std::move(saved.other_entries);
    out.more_state_dicts = std::move(saved.more_state_dicts);
  }
  out.shards.push_back({path, keys(out.state)});
  return out;
}

/// NeMo's `.nemo`: a tar archive holding `model_weights.ckpt` (a `torch.save` state dict) beside
/// its configuration and tokenizer files; with model parallelism one per rank (`mp_rank_00/`,
/// `tp_rank_00_pp_rank_000/`). The member is copied out to a scratch folder and read there.
Checkpoint read_archive(const std::string& path, const CheckpointReadOptions& options) {
  const auto tar = detail::list_tar(path);
  std::vector<const detail::TarMember*> weights;
  std::set<std::string> names;
  bool distributed = false;
  for (const auto& m : tar.members) {
    names.insert(m.path);
    const auto file = fs::path(m.path).filename().string();
    if (file == "model_weights.ckpt" && m.regular) weights.push_back(&m);
    if (file == ".metadata" || ends_with(file, ".distcp")) distributed = true;
  }
  if (weights.empty()) {
    if (!tar.gzip && names.count("pickle") && names.count("storages")) {
      return read_file(path, options, /*archives=*/false);  // torch.save's own tar: named there
    }
    if (distributed) {
      throw Error(ErrorCode::kUnsupported, "",
                  path +
                      ": a tar archive holding a torch.distributed.checkpoint folder (NeMo 2's "
                      "model_weights/), which wrapcert reads as a folder: extract the archive "
                      "(tar -xf) and name that folder");
    }
    std::string listed;
    size_t shown = 0;
    for (const auto& m : tar.members) {
      if (!m.regular) continue;
      if (++shown > 8) {
        listed += " ...";
        break;
      }
      listed += " " + m.path;
    }
    throw Error(ErrorCode::kUnsupported, "",
                path +
                    ": a tar archive with no model_weights.ckpt (where NeMo keeps its "
                    "weights); its files:" +
                    listed);
  }
  // The root's weights, else the first rank's by name.
  std::stable_sort(weights.begin(), weights.end(), [](const auto* a, const auto* b) {
    const bool ra = a->path == "model_weights.ckpt";
    const bool rb = b->path == "model_weights.ckpt";
    return ra != rb ? ra : a->path < b->path;
  });
  const detail::TarMember& chosen = *weights.front();
  auto scratch = std::make_shared<detail::UnnamedFile>();
  const std::string copy = scratch->path();
  {
    std::ofstream out(copy, std::ios::binary | std::ios::trunc);
    detail::extract_tar_member(path, chosen.name, out);
    out.close();
    if (!out) {
      throw Error(ErrorCode::kInvalidArgument, path,
                  "cannot copy " + chosen.name + " out of " + path + " to a scratch file");
    }
  }
  Checkpoint out;
  try {
    out = read_file(copy, options, /*archives=*/false);
  } catch (const Error& e) {
    // Named as the member of the archive, not as its scratch copy.
    std::string what = e.what();
    const std::string prefix = Error(e.code(), e.key_path(), "").what();
    if (what.compare(0, prefix.size(), prefix) == 0) what.erase(0, prefix.size());
    for (auto at = what.find(copy); at != std::string::npos; at = what.find(copy)) {
      what.replace(at, copy.size(), path + " (member " + chosen.name + ")");
    }
    throw Error(e.code(), e.key_path(), what);
  }
  out.archive = path;
  out.archive_member = chosen.name;
  out.scratch = scratch;
  if (weights.size() > 1 && chosen.path != "model_weights.ckpt") {
    out.partial = "the first of " + std::to_string(weights.size()) + " ranks (" + chosen.path + ")";
  }
  for (const auto& m : tar.members) {
    if (&m == &chosen || m.folder) continue;
    out.not_read.push_back(m.path);
  }
  std::sort(out.not_read.begin(), out.not_read.end());
  return out;
}

/// Appends the shards in order; a key in two shards is damage.
Checkpoint merge(std::vector<Checkpoint> parts, const std::string& where) {
  Checkpoint out;
  std::unordered_map<std::string, std::string> shard_of;
  for (auto& part : parts) {
    if (out.format.empty()) out.format = part.format;
    if (part.format != out.format) {
      throw detail::malformed_file(
          where, "shards of different formats (" + out.format + ", " + part.format + ")");
    }
    if (out.shards.empty()) {
      out.entry = part.entry;
      out.other_entries = part.other_entries;
      out.more_state_dicts = part.more_state_dicts;
    }
    const auto& file = part.shards.front().file;
    for (const auto& item : part.state) {
      const auto [it, fresh] = shard_of.emplace(item.key(), file);
      if (!fresh)
        throw detail::malformed_file(
            where, "the key is in two shards: " + it->second + " and " + file, item.key());
      out.state.insert(item.key(), item.value());
    }
    out.shards.push_back(std::move(part.shards.front()));
  }
  return out;
}

/// Where the symbolic links of `folder` may lead: for a snapshot of a Hugging Face cache
/// (`models--org--name/snapshots/REV`, its files linked into `../../blobs`) the cache's folder
/// for that model, else `folder` itself. Both as real paths.
fs::path link_root(const fs::path& folder) {
  std::error_code error;
  const auto real = fs::canonical(folder, error);
  if (error) return folder;
  for (auto p = real; p.has_parent_path() && p != p.parent_path(); p = p.parent_path()) {
    if (p.filename() == "snapshots" && fs::is_directory(p.parent_path() / "blobs", error)) {
      return p.parent_path();
    }
  }
  return real;
}

bool lies_within(const fs::path& path, const fs::path& root) {
  auto r = root.begin();
  auto p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

/// What an entry of a checkpoint folder is, links followed where they stay under `root`.
enum class EntryKind { kFile, kFolder, kOther };

/// Follows `path` when it is a symbolic link: to a regular file or a folder under `root` (a
/// Hugging Face snapshot's link into its cache's `blobs`). Throws `Error` (kMalformedInput)
/// naming the link for a loop, a link to nothing, or one that leads out of `root`.
EntryKind entry_kind(const fs::path& path, const fs::path& root) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return EntryKind::kOther;
  if (S_ISREG(st.st_mode)) return EntryKind::kFile;
  if (S_ISDIR(st.st_mode)) return EntryKind::kFolder;
  if (!S_ISLNK(st.st_mode)) return EntryKind::kOther;
  char target[4096];
  const auto n = ::readlink(path.c_str(), target, sizeof target - 1);
  const std::string to = n < 0 ? std::string("?") : std::string(target, static_cast<size_t>(n));
  std::error_code error;
  const auto real = fs::canonical(path, error);
  if (error) {
    throw detail::malformed_file(
        path.string(), error == std::errc::too_many_symbolic_link_levels
                           ? "a symbolic link loop (it points to '" + to + "')"
                           : "a symbolic link to nothing: '" + to + "' (" + error.message() + ")");
  }
  if (!lies_within(real, root)) {
    throw detail::malformed_file(path.string(), "a symbolic link that leads out of " +
                                                    root.string() + " (to " + real.string() +
                                                    "); wrapcert follows links only within it");
  }
  if (::stat(real.c_str(), &st) != 0) return EntryKind::kOther;
  return S_ISREG(st.st_mode)   ? EntryKind::kFile
         : S_ISDIR(st.st_mode) ? EntryKind::kFolder
                               : EntryKind::kOther;
}

Checkpoint read_index(const std::string& path, const CheckpointReadOptions& options) {
  std::string text;
  {
    const detail::InputFile in(path);
    if (in.size() > kMaxIndex) throw detail::malformed_file(path, "an index larger than 100 MiB");
    text.resize(in.size());
    in.read_at(0, text.data(), text.size());
  }
  const auto weight_map = detail::parse_shard_index(text, path);
  const auto folder = fs::path(path).parent_path();
  const auto root = link_root(folder.empty() ? fs::path(".") : folder);
  std::vector<std::string> files;
  std::unordered_map<std::string, std::string> placed;
  for (const auto& [key, file] : weight_map) {
    if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    placed.emplace(key, file);
  }
  std::sort(files.begin(), files.end());  // shards in name order, as Hugging Face loads them
  std::vector<Checkpoint> parts;
  for (const auto& file : files) {
    if (entry_kind(folder / file, root) != EntryKind::kFile) {
      const auto first = std::find_if(weight_map.begin(), weight_map.end(),
                                      [&](const auto& placed) { return placed.second == file; });
      throw detail::malformed_file(path,
                                   "the weight_map places the key in shard " + file +
                                       ", which is not a file in the index's folder",
                                   first->first);
    }
    auto part = read_file((folder / file).string(), options);
    for (const auto& item : part.state) {
      const auto it = placed.find(item.key());
      if (it == placed.end()) {
        throw detail::malformed_file(
            path, "the key is in shard " + file + " but missing from the weight_map", item.key());
      }
      if (it->second != file) {
        throw detail::malformed_file(
            path, "the key is in shard " + file + " but the weight_map places it in " + it->second,
            item.key());
      }
    }
    for (const auto& [key, shard] : weight_map) {
      if (shard == file && !part.state.contains(key)) {
        throw detail::malformed_file(
            path, "the weight_map places the key in shard " + file + ", which lacks it", key);
      }
    }
    parts.push_back(std::move(part));
  }
  auto out = merge(std::move(parts), path);
  out.index = path;
  return out;
}

/// For a variant's file name (diffusers' and Transformers' `variant`: "model.fp16.safetensors",
/// "model.fp16-00001-of-00002.safetensors", "model.safetensors.index.fp16.json"), the name of
/// the file it is a variant of; nothing for any other name.
/// A shard's name without its "-00001-of-00002" ("model-00001-of-00002.safetensors" ->
/// "model.safetensors"); nothing for a name that is no shard of a set.
std::optional<std::string> unsharded(const std::string& name) {
  static const std::regex shard(R"((.*)-[0-9]{5}-of-[0-9]{5}(\.[a-z]+))");
  std::smatch m;
  if (!std::regex_match(name, m, shard)) return std::nullopt;
  return m[1].str() + m[2].str();
}

std::optional<std::string> variant_base(const std::string& name) {
  static const std::regex index(R"((.+)\.index\.[A-Za-z0-9_]+\.json)");
  static const std::regex weights(
      R"((.+)\.[A-Za-z0-9_]+(-[0-9]{5}-of-[0-9]{5})?(\.safetensors|\.bin|\.pt|\.pth))");
  std::smatch m;
  if (std::regex_match(name, m, index)) return m[1].str() + ".index.json";
  if (std::regex_match(name, m, weights)) return m[1].str() + m[2].str() + m[3].str();
  return std::nullopt;
}

bool is_index_name(const std::string& name) {
  if (ends_with(name, ".index.json")) return true;
  const auto base = variant_base(fs::path(name).filename().string());
  return base && ends_with(*base, ".index.json");
}

bool is_shard_name(const std::string& name) {
  for (const char* ext : {".safetensors", ".bin", ".pt", ".pth"}) {
    if (ends_with(name, ext)) return true;
  }
  return false;
}

/// What trainers save beside the weights (Transformers' Trainer, Accelerate, DeepSpeed,
/// Lightning): never shards of the model.
bool is_training_state(const std::string& name) {
  static const std::set<std::string> names = {"optimizer.pt",     "optimizer.bin", "scheduler.pt",
                                              "scheduler.bin",    "scaler.pt",     "scaler.bin",
                                              "training_args.bin"};
  return names.count(name) > 0 || (name.rfind("rng_state", 0) == 0 && ends_with(name, ".pth")) ||
         (name.rfind("optimizer", 0) == 0 && is_shard_name(name)) || name == "distrib_optim.pt" ||
         ends_with(name, "optim_states.pt");
}

bool is_regular(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// The first line of a small regular file, trimmed; "" when there is none.
std::string pointer_file(const fs::path& path) {
  if (!is_regular(path)) return "";
  const detail::InputFile in(path.string());
  if (in.size() == 0 || in.size() > 4096) return "";
  std::string name(in.size(), '\0');
  in.read_at(0, name.data(), name.size());
  name = name.substr(0, name.find('\n'));
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}

/// Megatron-LM's root folder: `latest_checkpointed_iteration.txt` holds the iteration ("10",
/// folder `iter_0000010`) or "release".
std::string megatron_latest(const std::string& folder) {
  const auto text = pointer_file(fs::path(folder) / "latest_checkpointed_iteration.txt");
  if (text.empty()) return "";
  std::string name = text;
  if (text != "release") {
    if (text.size() > 7 || !std::all_of(text.begin(), text.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        })) {
      throw detail::malformed_file(
          (fs::path(folder) / "latest_checkpointed_iteration.txt").string(),
          "holds '" + text + "', neither an iteration nor 'release'");
    }
    name = "iter_" + std::string(7 - text.size(), '0') + text;
  }
  struct stat st {};
  if (::stat((fs::path(folder) / name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw detail::malformed_file(
        (fs::path(folder) / "latest_checkpointed_iteration.txt").string(),
        "names iteration " + text + ", whose folder " + name + " is missing");
  }
  return name;
}

/// DeepSpeed's root folder: `latest` names the step folder to load ("global_step10").
std::string deepspeed_latest(const std::string& folder) {
  const auto name = pointer_file(fs::path(folder) / "latest");
  struct stat st {};
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      ::stat((fs::path(folder) / name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return "";
  }
  return name;
}

Checkpoint read_folder(const std::string& path, const CheckpointReadOptions& options);

/// `path`'s subfolder `sub` read in its place, with `note`; every other entry of `path` but
/// `pointer` (the file that named `sub`) listed as kept, unchecked.
Checkpoint descend(const std::string& path, const std::string& sub, const std::string& pointer,
                   const std::string& note, const CheckpointReadOptions& options) {
  auto out = read_folder((fs::path(path) / sub).string(), options);
  out.notes.insert(out.notes.begin(), note);
  for (auto& name : out.not_read) name = sub + "/" + name;
  std::error_code error;
  std::vector<std::string> beside;  // the root's own files: a script, other steps
  for (const auto& entry : fs::directory_iterator(path, error)) {
    const auto name = entry.path().filename().string();
    if (name == sub || name == pointer) continue;
    beside.push_back(entry.is_directory(error) ? name + "/" : name);
  }
  std::sort(beside.begin(), beside.end());
  out.not_read.insert(out.not_read.end(), beside.begin(), beside.end());
  return out;
}

Checkpoint read_folder(const std::string& path, const CheckpointReadOptions& options) {
  if (const auto pipeline = read_pipeline(path)) {
    std::string names;
    for (const auto& c : pipeline->components) names += " " + (fs::path(path) / c).string();
    throw Error(ErrorCode::kUnsupported, "",
                path + ": a diffusers pipeline of " + std::to_string(pipeline->components.size()) +
                    " models, each its own checkpoint; read each:" + names);
  }
  if (const auto step = deepspeed_latest(path); !step.empty()) {
    return descend(path, step, "latest", "followed DeepSpeed's 'latest' to " + step, options);
  }
  if (const auto iteration = megatron_latest(path); !iteration.empty()) {
    return descend(path, iteration, "latest_checkpointed_iteration.txt",
                   "followed Megatron's latest_checkpointed_iteration.txt to " + iteration,
                   options);
  }
  std::vector<std::string> indexes, shards, training_state, distcp;
  // Every entry by name ("unet/" for a folder): what is not read is listed as kept, unchecked.
  std::vector<std::string> entries;
  bool dcp_metadata = false;
  std::error_code error;
  const auto root = link_root(path);
  for (const auto& entry : fs::directory_iterator(path, error)) {
    const auto name = entry.path().filename().string();
    if (name == ".metadata") dcp_metadata = true;
    if (ends_with(name, ".distcp")) distcp.push_back(name);
    const auto kind = entry_kind(entry.path(), root);
    entries.push_back(kind == EntryKind::kFolder ? name + "/" : name);
    if (kind != EntryKind::kFile) continue;
    if (is_index_name(name))
      indexes.push_back(entry.path().string());
    else if (is_training_state(name))
      training_state.push_back(name);
    else if (is_shard_name(name))
      shards.push_back(entry.path().string());
  }
  if (error) refuse(path, "cannot be listed: " + error.message());
  std::sort(entries.begin(), entries.end());
  if (dcp_metadata || !distcp.empty()) {
    if (!dcp_metadata) {
      throw detail::malformed_file(path, "a torch.distributed.checkpoint folder (" +
                                             std::to_string(distcp.size()) +
                                             " .distcp files) without its .metadata");
    }
    auto dcp = read_distributed_checkpoint(path, options.entry);
    Checkpoint out;
    out.format = kDistributedCheckpointFormat;
    out.state = std::move(dcp.state);
    out.entry = dcp.entry;
    out.other_entries = std::move(dcp.other_entries);
    out.index = dcp.metadata;
    for (auto& [file, keys] : dcp.files) out.shards.push_back({file, std::move(keys)});
    for (const auto& name : entries) {
      const bool read = name == ".metadata" ||
                        std::any_of(out.shards.begin(), out.shards.end(), [&](const auto& s) {
                          return fs::path(s.file).filename() == name;
                        });
      if (!read) out.not_read.push_back(name);
    }
    return out;
  }
  std::sort(indexes.begin(), indexes.end());
  std::sort(shards.begin(), shards.end());
  std::sort(training_state.begin(), training_state.end());
  std::vector<std::string> notes;
  std::string partial;
  // Variants beside the weights they are variants of (`model.fp16.safetensors` beside
  // `model.safetensors`): the same model saved again, each a checkpoint of its own.
  std::vector<std::string> variants;
  std::set<std::string> names;  // the weights and indexes of the folder
  for (const auto& f : indexes) names.insert(fs::path(f).filename().string());
  for (const auto& f : shards) names.insert(fs::path(f).filename().string());
  // A variant's base may be sharded where the variant is not, or the other way round:
  // model.fp16.safetensors beside model.safetensors.index.json is a variant too.
  const auto has_base = [&](const std::string& base) {
    const std::string index = ".index.json";
    if (names.count(base)) return true;
    if (ends_with(base, index)) return names.count(base.substr(0, base.size() - index.size())) > 0;
    const auto whole = unsharded(base).value_or(base);
    return names.count(whole) > 0 || names.count(whole + index) > 0;
  };
  auto pass_over_variants = [&](std::vector<std::string>& files) {
    std::vector<std::string> kept;
    for (const auto& f : files) {
      const auto name = fs::path(f).filename().string();
      const auto base = variant_base(name);
      if (!base || !has_base(*base)) {
        kept.push_back(f);
        continue;
      }
      // A sharded variant is read through its index; its shards are not checkpoints alone.
      if (!unsharded(name)) variants.push_back(f);
    }
    files = kept;
  };
  pass_over_variants(indexes);
  pass_over_variants(shards);
  std::sort(variants.begin(), variants.end());
  if (!variants.empty()) {
    std::string names;
    for (const auto& v : variants) names += " " + fs::path(v).filename().string();
    notes.push_back("variants of the weights, each a checkpoint of its own:" + names);
  }
  auto finish = [&](Checkpoint out) {
    out.partial = partial;
    out.variants = variants;
    const auto read = out.files();
    for (const auto& name : entries) {
      const bool was_read = std::any_of(read.begin(), read.end(), [&](const std::string& f) {
        return fs::path(f).filename() == name;  // every file read lies in this folder
      });
      const bool variant = std::any_of(variants.begin(), variants.end(), [&](const auto& v) {
        return fs::path(v).filename() == name;
      });
      if (!was_read && !variant) out.not_read.push_back(name);
    }
    out.notes = notes;
    return out;
  };
  // Safetensors first, as Transformers loads a folder that holds both.
  auto prefer_safetensors = [&](std::vector<std::string>& files, const char* what) {
    const auto is_st = [](const std::string& f) {
      return ends_with(f, ".safetensors") || ends_with(f, ".safetensors.index.json");
    };
    const bool any = std::any_of(files.begin(), files.end(), is_st);
    if (!any || std::all_of(files.begin(), files.end(), is_st)) return;
    std::vector<std::string> kept;
    for (const auto& f : files) {
      if (is_st(f)) kept.push_back(f);
    }
    notes.push_back(std::string("safetensors ") + what +
                    " preferred over the others, as Transformers loads them");
    files = kept;
  };
  prefer_safetensors(indexes, "index");
  if (indexes.size() > 1) {
    throw detail::malformed_file(path, "a folder with " + std::to_string(indexes.size()) +
                                           " index files; name the one to read (" + indexes[0] +
                                           ", " + indexes[1] + ")");
  }
  if (indexes.size() == 1) {
    return finish(read_index(indexes.front(), options));
  }
  prefer_safetensors(shards, "weights");
  // DeepSpeed writes one model-states file per rank, each the whole module (ZeRO-1/2) or its
  // placeholders (ZeRO-3): the first is checked.
  std::vector<std::string> model_states;
  for (const auto& shard : shards) {
    if (ends_with(shard, "model_states.pt")) model_states.push_back(shard);
  }
  if (!model_states.empty()) {
    if (model_states.size() > 1) {
      partial = "the first of " + std::to_string(model_states.size()) + " ranks' model states";
      notes.push_back("DeepSpeed saves model states per rank; " +
                      fs::path(model_states.front()).filename().string() + " is checked");
    }
    shards = {model_states.front()};
  }
  // Megatron's iteration folder: one folder per model-parallel rank.
  std::vector<std::string> ranks;
  for (const auto& name : entries) {
    if (name.rfind("mp_rank_", 0) == 0 && name.back() == '/') ranks.push_back(name);
  }
  if (shards.empty() && !ranks.empty()) {
    const auto first = ranks.front().substr(0, ranks.front().size() - 1);
    if (std::count(first.begin(), first.end(), '_') > 2) {  // mp_rank_00_000: a pipeline stage
      throw Error(ErrorCode::kUnsupported, "",
                  path + ": Megatron pipeline-parallel stages (" + first +
                      ", ...), each holding other layers; check one stage's " +
                      "model_optim_rng.pt with that stage's keys (--keys), or merge the stages "
                      "with Megatron's checkpoint converter first");
    }
    auto out = read_folder((fs::path(path) / first).string(), options);
    for (auto& name : out.not_read) name = first + "/" + name;
    out.notes.insert(out.notes.begin(), "Megatron saves a folder per tensor-parallel rank (" +
                                            std::to_string(ranks.size()) +
                                            "), each the same keys at its slice; " + first +
                                            " is checked");
    for (const auto& name : entries) {
      if (name != ranks.front()) out.not_read.push_back(name);
    }
    if (ranks.size() > 1) out.partial = "the first of " + std::to_string(ranks.size()) + " ranks";
    return out;
  }
  if (shards.empty()) {
    throw detail::malformed_file(
        path, "a folder with no checkpoint file and no index" +
                  (training_state.empty() ? std::string()
                                          : " (only training state: " + training_state[0] + ")"));
  }
  std::vector<Checkpoint> parts;
  parts.reserve(shards.size());
  for (const auto& shard : shards) parts.push_back(read_file(shard, options));
  return finish(merge(std::move(parts), path));
}

constexpr const char* kTemporarySuffix = ".wrapcert-new";

/// Where a shard is written before it takes its name (see `write_checkpoint`).
std::string temporary_shard(const std::string& path) {
  const auto p = fs::path(path);
  return (p.parent_path() / ("." + p.filename().string() + kTemporarySuffix)).string();
}

/// The name a temporary shard stands for, else `name` itself.
std::string settled_name(const std::string& name) {
  const size_t n = std::strlen(kTemporarySuffix);
  if (name.size() > n + 1 && name.front() == '.' && ends_with(name, kTemporarySuffix)) {
    return name.substr(1, name.size() - n - 1);
  }
  return name;
}

std::string with_format_extension(const std::string& name, CheckpointFormat format) {
  const std::string ext = format == CheckpointFormat::kSafetensors ? ".safetensors" : ".bin";
  for (const char* old : {".safetensors", ".bin", ".pt", ".pth", ".ckpt"}) {
    if (ends_with(name, old)) return name.substr(0, name.size() - std::strlen(old)) + ext;
  }
  return name + ext;
}

bool names_a_folder(const std::string& destination) {
  struct stat st {};
  return ends_with(destination, "/") ||
         (::lstat(destination.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}

/// For a sharded checkpoint written to an index or a folder: the index's path and format.
std::pair<std::string, CheckpointFormat> index_destination(const std::string& destination,
                                                           const Checkpoint& checkpoint) {
  if (!names_a_folder(destination)) return {destination, format_for(destination)};
  const auto format = checkpoint.format == "safetensors" ? CheckpointFormat::kSafetensors
                                                         : CheckpointFormat::kTorchSave;
  const std::string name =
      !checkpoint.index.empty()                  ? fs::path(checkpoint.index).filename().string()
      : format == CheckpointFormat::kSafetensors ? "model.safetensors.index.json"
                                                 : "pytorch_model.bin.index.json";
  return {(fs::path(destination) / name).string(), format};
}

/// Where a `torch.distributed.checkpoint` is written: the folder named, or the one of the
/// `.metadata` named.
std::string dcp_folder(const std::string& destination) {
  if (names_a_folder(destination)) return destination;
  if (fs::path(destination).filename() == ".metadata") {
    const auto folder = fs::path(destination).parent_path();
    return folder.empty() ? "." : folder.string();
  }
  refuse(destination, "is no folder: a torch.distributed.checkpoint is written to a folder");
}

void write_one(const std::string& path, CheckpointFormat format, const StateDict& state,
               const CheckpointWriteOptions& options,
               const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  if (format == CheckpointFormat::kDistributedCheckpoint) {
    throw Error(ErrorCode::kUnsupported, "",
                path + ": wrapcert writes a torch.distributed.checkpoint only as a fix of one");
  }
  if (format == CheckpointFormat::kSafetensors) {
    save_safetensors(path, state, metadata,
                     options.tie_copies ? SafetensorsTies::kCopy : SafetensorsTies::kStoreOnce);
  } else {
    save_torch_save(path, state);
  }
}

/// A safetensors file's own metadata, less what `save_safetensors` writes anew.
std::map<std::string, std::string> kept_metadata(const std::string& path) {
  auto metadata = read_safetensors_header(path).metadata;
  metadata.erase("wrapcert.order");
  metadata.erase("wrapcert.aliases");
  return metadata;
}

/// The index for `names` (shard file names): the source index's own entries kept (when there is
/// one), its `weight_map` and `metadata.total_size` written anew.
std::string index_text(const std::string& source_index,
                       const std::vector<std::pair<std::string, size_t>>& placement,
                       const std::vector<std::string>& names, uint64_t total) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!source_index.empty()) {
    const detail::InputFile in(source_index);
    std::string text(in.size(), '\0');
    in.read_at(0, text.data(), text.size());
    out = detail::parse_json_strictly(text, source_index, "the index");
  }
  std::map<std::string, std::string> weight_map;  // sorted, as Hugging Face writes indexes
  for (const auto& [key, shard] : placement) weight_map[key] = names[shard];
  if (!out.contains("metadata") || !out["metadata"].is_object()) {
    out["metadata"] = nlohmann::ordered_json::object();
  }
  out["metadata"]["total_size"] = total;
  out["weight_map"] = weight_map;
  return out.dump(2) + "\n";
}

/// Writes the shards (`write_shard(s, path)`) and then the index, `files.back()`, so that the
/// destination loads at every step (see `write_checkpoint`).
void commit_sharded(const std::vector<std::string>& files,
                    const std::function<void(size_t, const std::string&)>& write_shard,
                    const std::function<std::string(const std::vector<std::string>&)>& index,
                    const CheckpointWriteOptions& options) {
  const size_t n = files.size() - 1;
  auto note = [&options](const std::string& path) {
    if (options.on_file) options.on_file(path);
  };
  std::vector<std::string> temps, temp_names, names;
  bool replacing = false;
  for (size_t s = 0; s < files.size(); ++s) {
    struct stat st {};
    replacing = replacing || ::lstat(files[s].c_str(), &st) == 0;
    if (s == n) break;
    temps.push_back(temporary_shard(files[s]));
    temp_names.push_back(fs::path(temps.back()).filename().string());
    names.push_back(fs::path(files[s]).filename().string());
  }
  auto remove_temporaries = [&temps] {
    for (const auto& t : temps) ::unlink(t.c_str());
  };
  bool index_names_temporaries = false;
  try {
    for (size_t s = 0; s < n; ++s) {
      write_shard(s, temps[s]);
      note(temps[s]);
    }
    if (replacing) {  // the new checkpoint whole, under temporary names: it now loads
      write_file_atomically(files.back(), index(temp_names));
      index_names_temporaries = true;
      note(files.back());
    }
  } catch (...) {
    if (!index_names_temporaries) remove_temporaries();
    throw;
  }
  for (size_t s = 0; s < n; ++s) {
    link_atomically(temps[s], files[s]);
    note(files[s]);
  }
  write_file_atomically(files.back(), index(names));
  note(files.back());
  remove_temporaries();
}

/// Where each key of `checkpoint` goes (its shard) and the bytes the shards hold, ties once.
std::pair<std::vector<std::pair<std::string, size_t>>, uint64_t> placement(
    const Checkpoint& checkpoint, const std::function<std::string(const std::string&)>& rename) {
  std::vector<std::pair<std::string, size_t>> out;
  uint64_t total = 0;
  std::set<detail::SavedIdentity> counted;
  for (size_t s = 0; s < checkpoint.shards.size(); ++s) {
    for (const auto& key : checkpoint.shards[s].keys) {
      const auto& t = checkpoint.state[key];
      out.emplace_back(rename(key), s);
      if (t.defined() && counted.insert(detail::saved_identity(t)).second) total += t.nbytes();
    }
  }
  return {out, total};
}

}  // namespace

std::vector<std::string> Checkpoint::files() const {
  if (!archive.empty()) return {archive};
  std::vector<std::string> out;
  if (!index.empty()) out.push_back(index);
  for (const auto& s : shards) out.push_back(s.file);
  return out;
}

namespace detail {

std::vector<std::pair<std::string, std::string>> parse_shard_index(const std::string& text,
                                                                   const std::string& path) {
  const auto j = parse_json_strictly(text, path, "the index");
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
    throw detail::malformed_file(path, "an index needs a \"weight_map\" object");
  }
  if (j.contains("metadata") && !j.at("metadata").is_object()) {
    throw detail::malformed_file(path, "the index's metadata is not an object", "metadata");
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : j.at("weight_map").items()) {
    if (!value.is_string())
      throw detail::malformed_file(path, "the weight_map names no shard file for the key", key);
    const auto file = value.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      throw detail::malformed_file(
          path, "the shard '" + file + "' is not a file name in the index's folder", key);
    }
    out.emplace_back(key, file);
  }
  return out;
}

}  // namespace detail

Checkpoint read_checkpoint(const std::string& path, const CheckpointReadOptions& options) {
  struct stat st {};
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, "", "an empty checkpoint path");
  if (::stat(path.c_str(), &st) != 0) {
    refuse(path, std::string("cannot open it: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return read_folder(path, options);
  if (!S_ISREG(st.st_mode))
    refuse(path, "it is " + detail::describe_file_type(st.st_mode) + ", not a checkpoint file");
  if (is_index_name(path)) return read_index(path, options);
  if (fs::path(path).filename() == ".metadata") {
    return read_folder(
        fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(),
        options);
  }
  if (ends_with(path, ".distcp")) {
    throw Error(ErrorCode::kUnsupported, "",
                path +
                    ": one file of a torch.distributed.checkpoint folder, which holds pieces "
                    "of tensors that only the folder's .metadata names; name the folder");
  }
  return read_file(path, options);
}

std::optional<Pipeline> read_pipeline(const std::string& folder) {
  const auto index_path = fs::path(folder) / "model_index.json";
  const auto root = link_root(folder);
  if (entry_kind(index_path, root) != EntryKind::kFile) return std::nullopt;
  std::string text;
  {
    const detail::InputFile in(index_path.string());
    if (in.size() > kMaxIndex) {
      throw detail::malformed_file(index_path.string(), "larger than 100 MiB");
    }
    text.resize(in.size());
    in.read_at(0, text.data(), text.size());
  }
  const auto index = detail::parse_json_strictly(text, index_path.string(), "the pipeline index");
  if (!index.is_object()) {
    throw detail::malformed_file(index_path.string(), "not a JSON object");
  }
  Pipeline out;
  std::set<std::string> named;
  for (const auto& [name, value] : index.items()) {
    // A component is ["library", "Class"]; ["null", null] or [null, null] is one left out
    // (a pipeline saved without its safety checker); keys starting with '_' are the pipeline's.
    if (name.empty() || name.front() == '_' || !value.is_array() || value.size() != 2 ||
        !value[0].is_string() || !value[1].is_string()) {
      continue;
    }
    if (name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      throw detail::malformed_file(index_path.string(),
                                   "the component '" + name + "' is not a folder name", name);
    }
    named.insert(name + "/");
    const auto sub = fs::path(folder) / name;
    if (entry_kind(sub, root) != EntryKind::kFolder) {
      throw detail::malformed_file(index_path.string(),
                                   "names the component '" + name + "' (" +
                                       value[1].get<std::string>() + "), but " + sub.string() +
                                       " is no folder",
                                   name);
    }
    bool weights = false;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(sub, error)) {
      const auto file = entry.path().filename().string();
      if (is_shard_name(file) || is_index_name(file) || file == ".metadata") weights = true;
    }
    (weights ? out.components : out.not_read).push_back(weights ? name : name + "/");
  }
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    auto name = entry.path().filename().string();
    if (entry_kind(entry.path(), root) == EntryKind::kFolder) name += "/";
    if (!named.count(name)) out.not_read.push_back(name);
  }
  std::sort(out.not_read.begin(), out.not_read.end());
  return out;
}

std::vector<std::vector<std::string>> storage_ties(const StateDict& state) {
  std::map<detail::SavedIdentity, std::vector<std::string>> groups;
  std::vector<const std::vector<std::string>*> order;
  for (const auto& item : state) {
    if (!item.value().defined()) continue;  // extra state that is not a tensor
    auto& group = groups[detail::saved_identity(item.value())];
    if (group.empty()) order.push_back(&group);
    group.push_back(item.key());
  }
  std::vector<std::vector<std::string>> out;
  for (const auto* group : order) {
    if (group->size() > 1) out.push_back(*group);
  }
  return out;
}

CheckpointFormat format_for(const std::string& destination) {
  if (fs::path(destination).filename() == ".metadata" || ends_with(destination, ".distcp")) {
    return CheckpointFormat::kDistributedCheckpoint;
  }
  for (const char* ext : {".safetensors", ".safetensors.index.json"}) {
    if (ends_with(destination, ext)) return CheckpointFormat::kSafetensors;
  }
  for (const char* ext : {".nemo", ".tar", ".tar.gz", ".tgz"}) {
    if (ends_with(destination, ext)) return CheckpointFormat::kArchive;
  }
  for (const char* ext : {".pt", ".pth", ".bin", ".ckpt", ".bin.index.json", ".pt.index.json"}) {
    if (ends_with(destination, ext)) return CheckpointFormat::kTorchSave;
  }
  refuse(destination,
         "has no checkpoint extension: name it *.safetensors, or *.pt, *.pth, *.bin or *.ckpt "
         "for torch.save (a sharded checkpoint: *.safetensors.index.json, *.bin.index.json or a "
         "folder; an archive: *.nemo, *.tar, *.tar.gz)");
}

std::vector<std::string> planned_files(const std::string& destination,
                                       const Checkpoint& checkpoint) {
  if (checkpoint.format == kDistributedCheckpointFormat) {
    const auto folder = dcp_folder(destination);
    const auto source = fs::path(checkpoint.index).parent_path();
    std::error_code error;
    std::vector<std::string> out;
    if (!fs::equivalent(folder, source.empty() ? "." : source, error)) {
      for (const auto& shard : checkpoint.shards) {
        out.push_back((fs::path(folder) / fs::path(shard.file).filename()).string());
      }
    }
    out.push_back((fs::path(folder) / ".metadata").string());
    return out;
  }
  if (!names_a_folder(destination) && !is_index_name(destination) &&
      format_for(destination) == CheckpointFormat::kArchive && checkpoint.archive.empty()) {
    refuse(destination, "names an archive, which wrapcert writes only as the fix of one");
  }
  if (!checkpoint.sharded() || (!names_a_folder(destination) && !is_index_name(destination))) {
    if (names_a_folder(destination)) refuse(destination, "is a folder; name the file to write");
    if (is_index_name(destination)) {
      refuse(destination, "names an index, but the checkpoint is a single file");
    }
    return {destination};
  }
  const auto [index, format] = index_destination(destination, checkpoint);
  const auto folder = fs::path(index).parent_path();
  std::vector<std::string> out;
  for (const auto& shard : checkpoint.shards) {
    const auto name = settled_name(fs::path(shard.file).filename().string());
    out.push_back((folder / with_format_extension(name, format)).string());
  }
  out.push_back(index);
  return out;
}

void check_destination(const std::string& destination, const std::vector<std::string>& inputs,
                       bool in_place) {
  if (destination.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "", "an empty destination: name the file to write");
  }
  struct stat st {};
  const bool exists = ::lstat(destination.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    refuse(destination, "is " + detail::describe_file_type(st.st_mode) +
                            ", not a regular file: wrapcert writes only regular files and new "
                            "paths");
  }
  (void)format_for(destination);
  auto parent = fs::path(destination).parent_path();
  if (parent.empty()) parent = ".";
  struct stat folder {};
  if (::stat(parent.c_str(), &folder) != 0 || !S_ISDIR(folder.st_mode)) {
    refuse(destination, "lies in a folder that does not exist");
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    refuse(destination, std::string("cannot be written: its folder is not writable (") +
                            std::strerror(errno) + ")");
  }
  if (!exists) return;
  for (const auto& input : inputs) {
    struct stat in {};
    if (::stat(input.c_str(), &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino &&
        !in_place) {
      refuse(destination,
             "is the checkpoint being read; write elsewhere, or pass --in-place to replace it");
    }
  }
}

void write_checkpoint(const std::string& destination, const Checkpoint& checkpoint,
                      const CheckpointWriteOptions& options) {
  if (checkpoint.format == kDistributedCheckpointFormat) {
    throw Error(ErrorCode::kUnsupported, "",
                destination +
                    ": wrapcert writes a torch.distributed.checkpoint only as a fix of "
                    "one (write_fixed_checkpoint)");
  }
  const auto files = planned_files(destination, checkpoint);
  if (files.size() == 1) {
    write_one(destination, format_for(destination), checkpoint.state, options);
    if (options.on_file) options.on_file(destination);
    return;
  }
  const auto format = index_destination(destination, checkpoint).second;
  const auto placed = placement(checkpoint, [](const std::string& k) { return k; });
  const auto& where = placed.first;
  const uint64_t total = placed.second;
  commit_sharded(
      files,
      [&](size_t s, const std::string& path) {
        StateDict part;
        for (const auto& key : checkpoint.shards[s].keys) part.insert(key, checkpoint.state[key]);
        write_one(path, format, part, options);
      },
      [&](const std::vector<std::string>& names) { return index_text("", where, names, total); },
      options);
}

void write_fixed_checkpoint(const std::string& destination, const Checkpoint& source,
                            const std::vector<std::pair<std::string, std::string>>& renames,
                            const CheckpointWriteOptions& options) {
  write_fixed_checkpoint(destination, source, renames, {}, options);
}

void write_fixed_checkpoint(const std::string& destination, const Checkpoint& source,
                            const std::vector<std::pair<std::string, std::string>>& renames,
                            const std::vector<EntryRenames>& more,
                            const CheckpointWriteOptions& options) {
  if (source.format == kDistributedCheckpointFormat) {
    if (!more.empty()) {
      throw Error(ErrorCode::kUnsupported, "", destination + ": one state dict at a time");
    }
    const auto folder = fs::path(source.index).parent_path();
    write_renamed_distributed_checkpoint(folder.empty() ? "." : folder.string(),
                                         dcp_folder(destination), source.entry, renames,
                                         options.on_file);
    return;
  }
  const auto files = planned_files(destination, source);
  if (!source.archive.empty() && format_for(destination) == CheckpointFormat::kArchive) {
    if (source.format == "safetensors") {
      throw Error(ErrorCode::kUnsupported, "",
                  destination + ": the archive's weights are safetensors; write *.safetensors");
    }
    std::vector<EntryRenames> all = {{source.entry, renames}};
    all.insert(all.end(), more.begin(), more.end());
    const detail::ScratchFolder scratch;
    const auto fixed = scratch.path() + "/model_weights.ckpt";
    rewrite_torch_save(source.shards.front().file, fixed, all);
    write_file_atomically(destination, [&](std::ostream& out) {
      detail::rewrite_tar_member(source.archive, source.archive_member, fixed, out);
    });
    if (options.on_file) options.on_file(destination);
    return;
  }
  const bool one_file = files.size() == 1;
  const auto format =
      one_file ? format_for(destination) : index_destination(destination, source).second;
  if (!more.empty()) {
    std::string names = source.entry;
    for (const auto& e : more) names += ", " + e.entry;
    if (!one_file || source.shards.size() != 1 || source.format == "safetensors" ||
        format != CheckpointFormat::kTorchSave) {
      throw Error(ErrorCode::kUnsupported, "",
                  destination + ": the checkpoint holds " + std::to_string(more.size() + 1) +
                      " state dicts (" + names +
                      "), which only one torch.save file holds: write *.pt, or choose one with "
                      "--entry");
    }
    std::vector<EntryRenames> all = {{source.entry, renames}};
    all.insert(all.end(), more.begin(), more.end());
    rewrite_torch_save(source.shards.front().file, destination, all);
    if (options.on_file) options.on_file(destination);
    return;
  }
  const std::unordered_map<std::string, std::string> to(renames.begin(), renames.end());
  const auto renamed = [&to](const std::string& key) {
    const auto it = to.find(key);
    return it == to.end() ? key : it->second;
  };
  const bool copy_pickles =
      format == CheckpointFormat::kTorchSave && source.format != "safetensors";
  // Writes the source's shards `first..last` (their state dicts merged) to `path`.
  auto write_part = [&](size_t first, size_t last, const std::string& path) {
    if (copy_pickles && first == last) {
      rewrite_torch_save(source.shards[first].file, path, renames, source.entry);
      return;
    }
    StateDict state;
    std::map<std::string, std::string> metadata = {{"format", "pt"}};
    for (size_t s = first; s <= last; ++s) {
      const auto& file = source.shards[s].file;
      const auto part = read_file(file, {/*data=*/true, source.entry});
      for (const auto& item : part.state) state.insert(renamed(item.key()), item.value());
      if (source.format == "safetensors" && first == last) metadata = kept_metadata(file);
    }
    write_one(path, format, state, options, metadata);
  };
  if (one_file) {
    write_part(0, source.shards.size() - 1, destination);
    if (options.on_file) options.on_file(destination);
    return;
  }
  const auto placed = placement(source, renamed);
  const auto& where = placed.first;
  const uint64_t total = placed.second;
  commit_sharded(
      files, [&](size_t s, const std::string& path) { write_part(s, s, path); },
      [&](const std::vector<std::string>& names) {
        return index_text(source.index, where, names, total);
      },
      options);
}

Checkpoint rename_keys(const Checkpoint& checkpoint,
                       const std::vector<std::pair<std::string, std::string>>& renames) {
  std::unordered_map<std::string, std::string> to(renames.begin(), renames.end());
  auto renamed = [&to](const std::string& key) {
    const auto it = to.find(key);
    return it == to.end() ? key : it->second;
  };
  Checkpoint out = checkpoint;
  out.state = StateDict();
  for (const auto& item : checkpoint.state) {
    const auto key = renamed(item.key());
    if (out.state.contains(key)) {
      throw Error(ErrorCode::kKeyCollision, key, "two keys would both be renamed to '" + key + "'");
    }
    out.state.insert(key, item.value());
  }
  for (auto& shard : out.shards) {
    for (auto& key : shard.keys) key = renamed(key);
  }
  return out;
}

}  // namespace wrapcert
