#pragma once
/// Dotted paths and keys: `model.layers.0` names a module, `model.layers.0.mlp.up_proj.weight` a
/// tensor; "" is the root. The one place wrapcert splits and joins them.
///
///   join_path("model.layers", "0")              // "model.layers.0"
///   split_path("a..b")                          // {"a", "", "b"}: empty components kept
///   split_last("model.layers.0")                // {"model.layers", "0"}
///   for (PathComponents c(key); c.next(part);)  // no allocation

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wrapcert::detail {

inline std::string join_path(std::string_view prefix, std::string_view name) {
  std::string out(prefix);
  if (!out.empty()) out += '.';
  out += name;
  return out;
}

/// The dotted components of a path, one at a time, empty ones included ("a..b" has three, ""
/// has one), as views into the path.
class PathComponents {
 public:
  explicit PathComponents(std::string_view path) : rest_(path) {}
  bool next(std::string_view& out) {
    if (done_) return false;
    const auto dot = rest_.find('.');
    out = rest_.substr(0, dot);
    if (dot == std::string_view::npos) {
      done_ = true;
    } else {
      rest_.remove_prefix(dot + 1);
    }
    return true;
  }

 private:
  std::string_view rest_;
  bool done_ = false;
};

/// Every component of `path` (see `PathComponents`), as views into it.
inline std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::string_view part;
  for (PathComponents components(path); components.next(part);) parts.push_back(part);
  return parts;
}

/// `path` split at its last dot: the parent's path and the last name ({"", path} at the top).
inline std::pair<std::string_view, std::string_view> split_last(std::string_view path) {
  const auto dot = path.rfind('.');
  if (dot == std::string_view::npos) return {std::string_view(), path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

}  // namespace wrapcert::detail
