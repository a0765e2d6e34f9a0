#include <wrapcert/detail/python_names.h>
#include <wrapcert/error.h>
#include <wrapcert/io/detail/atomic_file.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/saved_identity.h>
#include <wrapcert/io/detail/strict_json.h>
#include <wrapcert/io/safetensors.h>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace wrapcert {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeader = 100'000'000;  // what the safetensors library accepts

const std::vector<std::pair<std::string, c10::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"F64", c10::kDouble}, {"F32", c10::kFloat}, {"F16", c10::kHalf},  {"BF16", c10::kBFloat16},
      {"I64", c10::kLong},   {"I32", c10::kInt},   {"I16", c10::kShort}, {"I8", c10::kChar},
      {"U8", c10::kByte},    {"BOOL", c10::kBool}};
  return table;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const detail::InputFile in(path);
  SafetensorsHeader header;
  header.file_size = in.size();
  if (header.file_size < 8)
    throw detail::malformed_file(path, "shorter than the 8-byte header length");
  unsigned char length_bytes[8];
  in.read_at(0, length_bytes, 8);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];  // little-endian
  if (length > kMaxHeader) {
    throw detail::malformed_file(path, "header length " + std::to_string(length) +
                                           " exceeds the limit of " + std::to_string(kMaxHeader) +
                                           " bytes");
  }
  if (length > header.file_size - 8) {
    throw detail::malformed_file(path, "header length " + std::to_string(length) +
                                           " exceeds the file (" +
                                           std::to_string(header.file_size) + " bytes)");
  }
  std::string text(length, '\0');
  in.read_at(8, text.data(), length);
  header.data_offset = 8 + length;
  const uint64_t data_size = header.file_size - header.data_offset;

  const auto j = detail::parse_json_strictly(text, path, "the header");
  if (!j.is_object()) throw detail::malformed_file(path, "the header is not a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        throw detail::malformed_file(path, "__metadata__ is not an object", key);
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          throw detail::malformed_file(path, "metadata values must be strings", key + "." + k);
        header.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      throw detail::malformed_file(path, "an entry needs dtype, shape and data_offsets", key);
    }
    SafetensorsEntry entry;
    entry.key = key;
    const auto dtype_name = value["dtype"].is_string() ? value["dtype"].get<std::string>() : "";
    const auto found = std::find_if(dtypes().begin(), dtypes().end(),
                                    [&](const auto& d) { return d.first == dtype_name; });
    if (found == dtypes().end())
      throw detail::malformed_file(path, "unknown dtype '" + dtype_name + "'", key);
    entry.dtype = found->second;
    if (!value["shape"].is_array()) throw detail::malformed_file(path, "shape is not a list", key);
    uint64_t numel = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        throw detail::malformed_file(
            path, "shape holds something other than a non-negative integer", key);
      }
      entry.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d.get<int64_t>()), &numel)) {
        throw detail::malformed_file(path, "the shape's element count overflows", key);
      }
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw detail::malformed_file(path, "data_offsets must be two non-negative integers", key);
    }
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size) {
      throw detail::malformed_file(path,
                                   "data offsets [" + std::to_string(entry.begin) + ", " +
                                       std::to_string(entry.end) + ") lie outside the " +
                                       std::to_string(data_size) + "-byte data section",
                                   key);
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, c10::elementSize(entry.dtype), &bytes) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw detail::malformed_file(path, "the shape's size in bytes overflows", key);
    }
    if (entry.end - entry.begin != bytes) {
      throw detail::malformed_file(path,
                                   "data offsets span " + std::to_string(entry.end - entry.begin) +
                                       " bytes, the dtype and shape need " + std::to_string(bytes),
                                   key);
    }
    ranges.emplace_back(entry.begin, entry.end);
    header.tensors.push_back(std::move(entry));
  }
  std::vector<size_t> order(header.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  // As the safetensors library requires: the tensors tile the data section, no overlap, no
  // gap, nothing after the last one.
  uint64_t end = 0;
  const SafetensorsEntry* before = nullptr;
  for (size_t i : order) {
    const auto& cur = header.tensors[i];
    if (cur.begin < end && cur.begin != cur.end) {
      throw detail::malformed_file(path, "its data overlaps '" + before->key + "'", cur.key);
    }
    if (cur.begin > end) {
      throw detail::malformed_file(
          path, std::to_string(cur.begin - end) + " bytes before its data belong to no tensor",
          cur.key);
    }
    if (cur.end > end) {
      end = cur.end;
      before = &cur;
    }
  }
  if (end != data_size) {
    throw detail::malformed_file(
        path, std::to_string(data_size - end) +
                  " bytes follow the last tensor's data and belong to no tensor");
  }
  return header;
}

std::vector<std::pair<std::string, std::string>> saved_keys(const SafetensorsHeader& header,
                                                            const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto order = header.metadata.find("wrapcert.order");
  const auto aliases = header.metadata.find("wrapcert.aliases");
  if (order == header.metadata.end()) {
    for (const auto& e : header.tensors) out.emplace_back(e.key, e.key);
    if (aliases == header.metadata.end()) return out;
    // Tied keys stored once: {"alias": ["target", place in the saved order], ...}.
    std::unordered_set<std::string> stored, listed;
    for (const auto& e : header.tensors) stored.insert(e.key);
    std::vector<std::tuple<size_t, std::string, std::string>> tied;
    try {
      const auto alias = nlohmann::json::parse(aliases->second);
      if (!alias.is_object())
        throw detail::malformed_file(path, "wrapcert.aliases is no object", "__metadata__");
      for (const auto& [key, value] : alias.items()) {
        if (!value.is_array() || value.size() != 2 || !value[0].is_string() ||
            !value[1].is_number_unsigned()) {
          throw detail::malformed_file(path, "a wrapcert alias is not [target, position]", key);
        }
        const auto target = value[0].get<std::string>();
        if (!stored.count(target))
          throw detail::malformed_file(path, "an alias of a tensor the file lacks", key);
        if (stored.count(key))
          throw detail::malformed_file(path, "both stored and listed as an alias", key);
        tied.emplace_back(value[1].get<size_t>(), key, target);
      }
    } catch (const nlohmann::json::exception& e) {
      throw detail::malformed_file(path, std::string("wrapcert metadata is damaged: ") + e.what(),
                                   "__metadata__");
    }
    std::sort(tied.begin(), tied.end());
    for (const auto& [position, key, target] : tied) {
      if (position > out.size())
        throw detail::malformed_file(path, "an alias placed past the last key", key);
      out.insert(out.begin() + static_cast<std::ptrdiff_t>(position), {key, target});
    }
    return out;
  }
  // Files written by earlier versions: every key in `wrapcert.order`, aliases as key -> target.
  std::unordered_set<std::string> stored;
  for (const auto& e : header.tensors) stored.insert(e.key);
  std::unordered_set<std::string> seen;
  try {
    const auto keys = nlohmann::json::parse(order->second);
    const auto alias = aliases == header.metadata.end() ? nlohmann::json::object()
                                                        : nlohmann::json::parse(aliases->second);
    for (const auto& k : keys) {
      const auto key = k.get<std::string>();
      const auto target = alias.contains(key) ? alias[key].get<std::string>() : key;
      if (!stored.count(target))
        throw detail::malformed_file(path, "an alias of a tensor the file lacks", key);
      if (!seen.insert(key).second)
        throw detail::malformed_file(path, "the key is listed twice", key);
      out.emplace_back(key, target);
    }
  } catch (const nlohmann::json::exception& e) {
    throw detail::malformed_file(path, std::string("wrapcert metadata is damaged: ") + e.what(),
                                 "__metadata__");
  }
  // The listing may not hide a stored tensor: each is saved under some key.
  std::unordered_set<std::string> reached;
  for (const auto& [key, target] : out) reached.insert(target);
  for (const auto& e : header.tensors) {
    if (!reached.count(e.key)) {
      throw detail::malformed_file(path, "stored in the file but missing from wrapcert.order",
                                   e.key);
    }
  }
  return out;
}

namespace {

StateDict read_safetensors(const std::string& path, bool data) {
  const auto header = read_safetensors_header(path);
  const auto saved = saved_keys(header, path);
  std::unique_ptr<detail::InputFile> in;
  if (data) in = std::make_unique<detail::InputFile>(path);
  std::unordered_map<std::string, torch::Tensor> stored;
  for (const auto& e : header.tensors) {
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype).device(
                                       data ? c10::Device(c10::kCPU) : c10::Device(c10::kMeta)));
    if (data && e.end > e.begin)
      in->read_at(header.data_offset + e.begin, t.data_ptr(), e.end - e.begin);
    stored.emplace(e.key, t);
  }
  StateDict state;
  for (const auto& [key, target] : saved) state.insert(key, stored.at(target));
  return state;
}

}  // namespace

StateDict load_safetensors(const std::string& path) {
  return read_safetensors(path, true);
}

StateDict list_safetensors(const std::string& path) {
  return read_safetensors(path, false);
}

void save_safetensors(const std::string& path, const StateDict& state,
                      const std::map<std::string, std::string>& metadata, SafetensorsTies ties) {
  // Keys go in saved order, appended (an ordered object's operator[] searches the keys before
  // it: quadratic). A tied key stored once is listed in `wrapcert.aliases` with its target and
  // its place in the saved order, so the header holds every other key once.
  ordered_json entries = ordered_json::object();
  auto& entry_list = *entries.get_ptr<ordered_json::object_t*>();
  entry_list.reserve(state.size() + 1);
  nlohmann::ordered_json aliases = nlohmann::ordered_json::object();
  auto& alias_list = *aliases.get_ptr<nlohmann::ordered_json::object_t*>();
  std::map<detail::SavedIdentity, std::string> first_key;
  std::vector<torch::Tensor> blobs;
  uint64_t offset = 0;
  size_t position = 0;
  for (const auto& item : state) {
    if (!item.value().defined()) {
      throw Error(ErrorCode::kUnsupported, item.key(),
                  path +
                      ": a module's extra state that is not a tensor cannot be stored in "
                      "safetensors; write torch.save (*.pt, *.bin) to keep it");
    }
    const size_t here = position++;
    if (ties == SafetensorsTies::kStoreOnce) {
      auto identity = detail::saved_identity(item.value());
      if (auto it = first_key.find(identity); it != first_key.end()) {
        alias_list.emplace_back(item.key(), nlohmann::ordered_json::array({it->second, here}));
        continue;  // a tied weight: stored once
      }
      first_key.emplace(std::move(identity), item.key());
    }
    if (item.value().is_meta()) {
      throw Error(ErrorCode::kInvalidArgument, item.key(),
                  "a tensor on the meta device has no data to save");
    }
    const auto t = item.value().detach().to(torch::kCPU).contiguous();
    const auto name = std::find_if(dtypes().begin(), dtypes().end(),
                                   [&](const auto& d) { return d.second == t.scalar_type(); });
    if (name == dtypes().end()) {
      throw Error(ErrorCode::kUnsupported, item.key(),
                  path + ": safetensors has no dtype for " +
                      detail::python_dtype_name(t.scalar_type()) +
                      "; write torch.save (*.pt, *.bin) to keep it");
    }
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    entry_list.emplace_back(item.key(), ordered_json{{"dtype", name->first},
                                                     {"shape", t.sizes().vec()},
                                                     {"data_offsets", {offset, offset + bytes}}});
    offset += bytes;
    blobs.push_back(t);
  }
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  if (!alias_list.empty()) meta["wrapcert.aliases"] = aliases.dump();
  std::string text = "{\"__metadata__\":" + meta.dump();
  for (const auto& [key, value] : entry_list) {
    text += ',';
    text += ordered_json(key).dump();
    text += ':';
    text += value.dump();
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section, as HF does
  if (text.size() > kMaxHeader) {
    throw Error(ErrorCode::kUnsupported, "",
                path + ": the header would take " + std::to_string(text.size()) +
                    " bytes, over the " + std::to_string(kMaxHeader) +
                    " that safetensors readers accept; write torch.save, or more shards");
  }

  write_file_atomically(path, [&](std::ostream& out) {
    uint64_t length = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : blobs) {
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
  });
}

}  // namespace wrapcert
