#include <wrapcert/error.h>
#include <wrapcert/keys.h>
#include <wrapcert/printer.h>
#include <wrapcert/python/bridge.h>

#include <wrapcert/detail/path.h>
#include <wrapcert/layer.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/unwrap.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

namespace wrapcert::bridge {
namespace {

props::Verdict verdict(const std::string& property, bool passed, std::string reason = {},
                       std::string key = {}) {
  props::Verdict v;
  v.property = property;
  v.passed = passed;
  v.reason = std::move(reason);
  v.key = std::move(key);
  return v;
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* field) {
  if (!j.contains(field) || !j[field].is_array()) {
    throw Error(ErrorCode::kInvalidArgument, field,
                "the bridge JSON has no list '" + std::string(field) + "'");
  }
  std::vector<std::string> out;
  for (const auto& item : j[field]) {
    if (!item.is_string()) {
      throw Error(ErrorCode::kInvalidArgument, field,
                  "a key in '" + std::string(field) + "' is not a string");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

props::Verdict compare(const std::string& property, const std::vector<std::string>& got,
                       const std::vector<std::string>& want) {
  if (const auto difference = props::first_key_difference(got, want)) {
    return verdict(property, false, difference->describe(), difference->key());
  }
  return verdict(property, true);
}

}  // namespace

std::vector<props::Verdict> check_fsdp_v2_keys(const std::string& json_text,
                                               const fixtures::CausalLMConfig& config) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e99999
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("the bridge JSON does not parse: ") + e.what());
  }
  const auto original = string_list(j, "original");
  const auto wrapped = string_list(j, "wrapped");
  const auto legacy = string_list(j, "legacy");
  const auto recursive = string_list(j, "recursive");

  const auto fixture = keys(state_dict(fixtures::make_causal_lm(config, {c10::kMeta})));
  std::vector<props::Verdict> out;
  out.push_back(compare("layout", original, fixture));
  out.push_back(compare("P1 keys (recursive unwrap)", recursive, fixture));
  out.push_back(compare("P1 keys (legacy unwrap)", legacy, fixture));

  auto replica =
      fixtures::apply_fsdp_v2_recipe(fixtures::make_causal_lm(config, {c10::kMeta}), config);
  const auto tr = KeyTranslator::from_tree(replica);
  auto p8 = compare("P8 translation", wrapped, keys(state_dict(replica)));
  if (p8.passed) {
    for (size_t i = 0; i < wrapped.size(); ++i) {
      if (tr.to_clean(wrapped[i]) != original.at(i)) {
        p8 = verdict("P8 translation", false, "translates to '" + tr.to_clean(wrapped[i]) + "'",
                     wrapped[i]);
        break;
      }
    }
  }
  out.push_back(p8);

  if (j.contains("printout") && j["printout"].is_string()) {
    // PyTorch compresses repeated ModuleList elements from 2.0 on.
    const auto version = j.value("torch_version", std::string("0"));
    PrintOptions print;
    print.compress_repeated = !version.empty() && version[0] >= '2';
    const bool same = format_tree(replica, print) == j["printout"].get<std::string>();
    out.push_back(verdict("printout", same, same ? "" : "the C++ printout differs from PyTorch's"));
  }
  return out;
}

namespace {

class MirrorImpl : public Layer {
 public:
  explicit MirrorImpl(std::string python_class) : python_class_(std::move(python_class)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
  std::string python_name() const override { return python_class_; }

 private:
  std::string python_class_;
};

/// A key path, spelled out only when an error needs it: a dump can be deep enough that
/// spelling every path would take quadratic memory.
using Where = std::function<std::string()>;

c10::ScalarType dtype_of(const std::string& name, const Where& where) {
  static const std::map<std::string, c10::ScalarType> table = {
      {"float32", c10::kFloat},     {"float64", c10::kDouble}, {"float16", c10::kHalf},
      {"bfloat16", c10::kBFloat16}, {"int64", c10::kLong},     {"int32", c10::kInt},
      {"int8", c10::kChar},         {"uint8", c10::kByte},     {"bool", c10::kBool}};
  const auto it = table.find(name);
  if (it == table.end()) throw Error(ErrorCode::kInvalidArgument, where(), "unknown dtype " + name);
  return it->second;
}

/// LibTorch's own checks on a name, as an error naming the path instead of a c10::Error.
void guard_name(const torch::nn::Module& module, const std::string& name, const Where& where) {
  if (name.empty() || name.find('.') != std::string::npos) {
    throw Error(ErrorCode::kMalformedInput, where(), "a name that is empty or holds a dot");
  }
  if (module.named_parameters(false).contains(name) || module.named_buffers(false).contains(name) ||
      module.named_children().contains(name)) {
    throw Error(ErrorCode::kMalformedInput, where(), "the name is used twice in one module");
  }
}

}  // namespace

ModulePtr load_tree_dump(const std::string& json_text, const Registry& registry) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e99999
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("the dump does not parse: ") + e.what());
  }
  if (!j.is_object() || !j.contains("nodes") || !j["nodes"].is_array() || !j.contains("root")) {
    throw Error(ErrorCode::kInvalidArgument, "", "the dump has no nodes or root");
  }
  const auto& nodes = j["nodes"];
  const auto wrappers = j.value("wrappers", nlohmann::json::object());
  if (!wrappers.is_object()) throw Error(ErrorCode::kInvalidArgument, "", "wrappers is no map");
  std::map<int64_t, torch::Tensor> storages;
  std::vector<ModulePtr> built(nodes.size());
  // Dropped parents first when this returns or throws, so no destructor recurses down a deep
  // dump (see release_tree).
  std::vector<size_t> build_order;
  struct ReleaseParentsFirst {
    std::vector<ModulePtr>& built;
    std::vector<size_t>& order;
    ~ReleaseParentsFirst() {
      for (auto it = order.rbegin(); it != order.rend(); ++it) built[*it].reset();
    }
  } release{built, build_order};
  std::vector<char> in_progress(nodes.size(), 0);

  // Every child edge followed: the node, the edge it was reached by, and its name.
  struct Entry {
    size_t node;
    size_t parent;  // index into `entries`; npos for the root
    std::string name;
  };
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<Entry> entries;
  auto path_of = [&entries](size_t e) {
    std::vector<const std::string*> names;
    for (; e != kNone && entries[e].parent != kNone; e = entries[e].parent) {
      names.push_back(&entries[e].name);
    }
    std::string path;
    for (auto it = names.rbegin(); it != names.rend(); ++it) path = detail::join_path(path, **it);
    return path;
  };
  auto below = [&path_of](size_t e, const std::string& name) -> Where {
    return [&path_of, e, &name] { return detail::join_path(path_of(e), name); };
  };

  // nlohmann converts a float to an integer with a plain cast (undefined out of range, found by
  // the fuzzer under UBSan): integers are checked to be integers first.
  auto integer = [](const nlohmann::json& v, const Where& where) {
    if (!v.is_number_integer()) {
      throw Error(ErrorCode::kMalformedInput, where(), "expected an integer, found " + v.dump());
    }
    return v.get<int64_t>();
  };
  auto tensor = [&](const nlohmann::json& t, const Where& where) {
    const auto storage = integer(t.at(3), where);
    if (!t.at(1).is_array()) throw Error(ErrorCode::kMalformedInput, where(), "no shape list");
    std::vector<int64_t> shape;
    for (const auto& d : t.at(1)) shape.push_back(integer(d, where));
    const auto dtype = dtype_of(t.at(2).get<std::string>(), where);
    if (auto it = storages.find(storage); it != storages.end()) {
      if (it->second.sizes() != c10::IntArrayRef(shape) || it->second.scalar_type() != dtype) {
        throw Error(ErrorCode::kMalformedInput, where(),
                    "shares storage " + std::to_string(storage) +
                        " with a tensor of another shape or dtype");
      }
      return it->second;
    }
    // The size in bytes must fit LibTorch's int64 (found by the fuzzer: [2^63 - 1] floats).
    int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
    for (const auto d : shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) {
        throw Error(ErrorCode::kMalformedInput, where(),
                    "a shape with a negative or too large size");
      }
    }
    auto value = torch::empty(shape, torch::TensorOptions().device(c10::kMeta).dtype(dtype));
    storages.emplace(storage, value);
    return value;
  };
  auto node_at = [&](const nlohmann::json& index, const Where& where) -> size_t {
    if (!index.is_number_unsigned() || index.get<size_t>() >= nodes.size()) {
      throw Error(ErrorCode::kMalformedInput, where(), "refers to no node of the dump");
    }
    return index.get<size_t>();
  };

  // Depth-first without recursion (a dump may be deeper than the stack): an entry is visited
  // once to push its children, and built when it is met again with all of them built.
  std::vector<size_t> stack;
  const auto root = node_at(j["root"], [] { return std::string(); });
  entries.push_back({root, kNone, ""});
  stack.push_back(0);
  try {
    while (!stack.empty()) {
      const size_t e = stack.back();
      const size_t index = entries[e].node;
      const auto& node = nodes[index];
      const auto cls = node.at("class").get<std::string>();
      const auto& children = node.at("children");
      if (built[index]) {
        stack.pop_back();
        continue;
      }
      if (!in_progress[index]) {
        in_progress[index] = 1;
        for (const auto& c : children) {
          const auto name = c.at(0).get<std::string>();
          const auto child = node_at(c.at(1), below(e, name));
          if (in_progress[child] && !built[child]) {
            throw Error(ErrorCode::kCycle, below(e, name)(),
                        "the dump's module is its own ancestor");
          }
          if (!built[child]) {
            entries.push_back({child, e, name});
            stack.push_back(entries.size() - 1);
          }
        }
        continue;
      }
      stack.pop_back();
      ModulePtr module;
      if (wrappers.contains(cls)) {
        const auto kind_name = wrappers[cls].get<std::string>();
        if (!registry.contains(kind_name)) {
          throw Error(ErrorCode::kUnknownWrapper, path_of(e),
                      "the dump maps " + cls + " to '" + kind_name +
                          "', which is not a registered wrapper kind");
        }
        const auto& kind = registry.at(kind_name);
        if (children.size() != 1 || children[0].at(0).get<std::string>() != kind.slot ||
            !node.at("params").empty() || !node.at("buffers").empty()) {
          throw Error(ErrorCode::kWrapperState, path_of(e),
                      cls + " should hold just one child, at '" + kind.slot + "'");
        }
        module = kind.make(built[children[0].at(1).get<size_t>()]);
      } else {
        auto mirror = std::make_shared<MirrorImpl>(cls);
        for (const auto& p : node.at("params")) {
          const auto name = p.at(0).get<std::string>();
          guard_name(*mirror, name, below(e, name));
          mirror->register_parameter(name, tensor(p, below(e, name)));
        }
        for (const auto& b : node.at("buffers")) {
          const auto name = b.at(0).get<std::string>();
          guard_name(*mirror, name, below(e, name));
          mirror->register_buffer(name, tensor(b, below(e, name)));
        }
        for (const auto& c : children) {
          const auto name = c.at(0).get<std::string>();
          guard_name(*mirror, name, below(e, name));
          mirror->register_module(name, built[c.at(1).get<size_t>()]);
        }
        module = mirror;
      }
      built[index] = module;
      build_order.push_back(index);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, stack.empty() ? std::string() : path_of(stack.back()),
                std::string("the dump is malformed: ") + e.what());
  } catch (const c10::Error& e) {  // a check of LibTorch's that the ones above did not foresee
    const std::string what = e.what();
    throw Error(ErrorCode::kMalformedInput, stack.empty() ? std::string() : path_of(stack.back()),
                "LibTorch refused the dump: " + what.substr(0, what.find('\n')));
  }
  return std::move(built[root]);
}

std::vector<props::Verdict> check_tree_dump(const std::string& json_text) {
  const auto mirror = load_tree_dump(json_text);
  const auto j = nlohmann::json::parse(json_text);  // parsed once already: cannot fail
  std::vector<std::string> clean, wrapped;
  bool has_wrappers = false;
  try {
    clean = j.at("clean_keys").get<std::vector<std::string>>();
    wrapped = j.at("wrapped_keys").get<std::vector<std::string>>();
    const auto wrappers = j.value("wrappers", nlohmann::json::object());
    for (const auto& node : j.at("nodes")) {
      has_wrappers = has_wrappers || wrappers.contains(node.at("class").get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "", std::string("the dump is malformed: ") + e.what());
  }
  std::vector<props::Verdict> out;
  const auto view = unwrap_reference(mirror);
  const auto unwrapped = view.state_dict();
  out.push_back(compare("P1 keys", keys(unwrapped), clean));

  // What PyTorch's state_dict() shows: the mirror's keys with the slots of wrappers that hide
  // theirs left out.
  const auto& registry = Registry::global();
  const auto saved = ModuleView::build(mirror, [&registry](const torch::nn::Module& m) {
                       const auto* kind = registry.find(m);
                       return kind && kind->state_dict_hides_slot ? kind : nullptr;
                     }).state_dict();
  auto p8 = compare("P8 translation", keys(saved), wrapped);
  const auto tr = KeyTranslator::from_tree(mirror);
  const auto physical = keys(state_dict(mirror));
  if (p8.passed && physical.size() == clean.size()) {
    for (size_t i = 0; i < physical.size(); ++i) {
      if (tr.to_clean(physical[i]) != clean[i]) {
        p8 = verdict("P8 translation", false, "translates to '" + tr.to_clean(physical[i]) + "'",
                     physical[i]);
        break;
      }
    }
  }
  out.push_back(p8);

  std::set<std::vector<std::string>> expected_ties;
  for (auto group : props::tie_groups(state_dict(mirror))) {
    for (auto& key : group) key = tr.to_clean(key);
    expected_ties.insert(group);
  }
  const bool ties = props::tie_groups(unwrapped) == expected_ties;
  out.push_back(verdict("P3 ties", ties, ties ? "" : "tied keys came apart"));

  if (!has_wrappers) out.push_back(compare("P9 no false positives", keys(unwrapped), wrapped));
  return out;
}

std::string python() {
  if (const char* p = std::getenv("WRAPCERT_PYTHON"); p && *p) return p;
  std::error_code ec;
  if (std::filesystem::exists("/usr/bin/python3", ec)) return "/usr/bin/python3";
  return "python3";
}

bool run_seed_script(const std::string& script, const std::string& out_json, bool emulate) {
  const std::string command = "'" + python() + "' '" + script + "' --out '" + out_json + "'" +
                              (emulate ? " --emulate" : "") + " > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

}  // namespace wrapcert::bridge
