#pragma once
/// Dotted key paths: `join_path("model.layers", "0")` is "model.layers.0"; "" is the root.

#include <string>
#include <string_view>

namespace wrapcert::detail {

inline std::string join_path(std::string_view prefix, std::string_view name) {
  std::string out(prefix);
  if (!out.empty()) out += '.';
  out += name;
  return out;
}

}  // namespace wrapcert::detail
