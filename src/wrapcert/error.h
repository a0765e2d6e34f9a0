#pragma once
/// The one exception type wrapcert throws for misuse and bad input.
///
///   try { wrapcert::unwrap_reference(model); }
///   catch (const wrapcert::Error& e) { std::cerr << e.what() << " at " << e.key_path(); }
///
/// A failed *check* is data in a report, never an Error.

#include <stdexcept>
#include <string>
#include <string_view>

namespace wrapcert {

enum class ErrorCode {
  kInvalidArgument,  ///< a bad option or argument
  kUnknownPath,      ///< a dotted module path that names no submodule
  kUnknownWrapper,   ///< a wrapper kind name that is not registered
  kDuplicateKind,    ///< a wrapper kind registered twice (by name or by type)
  kCycle,            ///< a module is its own ancestor
  kRecursionLimit,   ///< a subject that recurses like Python hit Python's limit
  kEmptySlot,        ///< a wrapper whose child slot holds no module
  kWrapperState,     ///< a wrapper holds state outside its slot that its kind does not declare
  kKeyCollision,     ///< a key translation that is not one-to-one
  kUnknownKey,       ///< a state-dict key that the tree does not have
  kNotForwardable,   ///< a module type wrapcert cannot call `forward` on
  kMalformedInput,   ///< a damaged or unreadable file
  kUnsupported,      ///< a valid file that wrapcert does not read, or that does not load as it is
  kTooManyPaths,     ///< modules reached by so many paths that listing every key would not end
};

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  /// `key_path` names the offending module path or key ("" is the root).
  Error(ErrorCode code, std::string key_path, const std::string& message);

  ErrorCode code() const noexcept { return code_; }
  const std::string& key_path() const noexcept { return key_path_; }

 private:
  ErrorCode code_;
  std::string key_path_;
};

}  // namespace wrapcert
