#include <wrapcert/error.h>
#include <wrapcert/io/detail/strict_json.h>

#include <nlohmann/json.hpp>

#include <set>
#include <vector>

namespace wrapcert::detail {

nlohmann::ordered_json parse_json_strictly(const std::string& text, const std::string& path,
                                           const std::string& what) {
  using json = nlohmann::ordered_json;
  struct Level {
    std::set<std::string> keys;
    std::string current;
  };
  std::vector<Level> levels;
  std::string repeated;
  const json::parser_callback_t check = [&](int /*depth*/, json::parse_event_t event,
                                            json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        levels.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!levels.empty()) levels.pop_back();
        break;
      case json::parse_event_t::key: {
        auto& level = levels.back();
        level.current = parsed.get<std::string>();
        if (!level.keys.insert(level.current).second && repeated.empty()) {
          for (const auto& l : levels) repeated += (repeated.empty() ? "" : ".") + l.current;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text, check);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kMalformedInput, "", path + ": " + what + " is not JSON: " + e.what());
  }
  if (!repeated.empty()) {
    throw Error(ErrorCode::kMalformedInput, repeated,
                path + ": " + what + " names '" + repeated + "' twice");
  }
  return parsed;
}

}  // namespace wrapcert::detail
