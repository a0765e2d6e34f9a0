#include <wrapcert/error.h>

namespace wrapcert {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kUnknownPath:
      return "unknown path";
    case ErrorCode::kUnknownWrapper:
      return "unknown wrapper";
    case ErrorCode::kDuplicateKind:
      return "duplicate wrapper kind";
    case ErrorCode::kCycle:
      return "cycle";
    case ErrorCode::kRecursionLimit:
      return "recursion limit";
    case ErrorCode::kEmptySlot:
      return "empty slot";
    case ErrorCode::kWrapperState:
      return "wrapper state";
    case ErrorCode::kKeyCollision:
      return "key collision";
    case ErrorCode::kUnknownKey:
      return "unknown key";
    case ErrorCode::kNotForwardable:
      return "not forwardable";
    case ErrorCode::kMalformedInput:
      return "malformed input";
    case ErrorCode::kUnsupported:
      return "not supported";
    case ErrorCode::kTooManyPaths:
      return "too many paths";
  }
  return "error";
}

namespace {
std::string compose(ErrorCode code, const std::string& key_path, const std::string& message) {
  std::string out = "wrapcert: ";
  out += to_string(code);
  out += " at '";
  out += key_path.empty() ? "<root>" : key_path;
  out += "': ";
  out += message;
  return out;
}
}  // namespace

Error::Error(ErrorCode code, std::string key_path, const std::string& message)
    : std::runtime_error(compose(code, key_path, message)),
      code_(code),
      key_path_(std::move(key_path)) {}

}  // namespace wrapcert
