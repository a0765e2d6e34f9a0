#include <wrapcert/bridge.h>
#include <wrapcert/error.h>
#include <wrapcert/keys.h>
#include <wrapcert/printer.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

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
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      return verdict(
          property, false,
          "key " + std::to_string(i) + " is '" + got[i] + "', expected '" + want[i] + "'", got[i]);
    }
  }
  if (got.size() != want.size()) {
    return verdict(property, false,
                   std::to_string(got.size()) + " keys, expected " + std::to_string(want.size()));
  }
  return verdict(property, true);
}

}  // namespace

std::vector<props::Verdict> check_seed_keys(const std::string& json_text,
                                            const fixtures::CausalLMConfig& config) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
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
      fixtures::apply_seed_recipe(fixtures::make_causal_lm(config, {c10::kMeta}), config);
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
