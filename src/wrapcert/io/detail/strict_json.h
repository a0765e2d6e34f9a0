#pragma once
/// JSON as checkpoint headers and indexes must be read: an object that names a key twice is
/// damage, not "the last one wins" (nlohmann's default, and what a forged header relies on).

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace wrapcert::detail {

/// Parses `text`; throws `Error` (kMalformedInput) naming `path` and `what` ("the header"), and
/// for a repeated key its dotted path, when the text is not JSON or repeats a key.
nlohmann::ordered_json parse_json_strictly(const std::string& text, const std::string& path,
                                           const std::string& what);

}  // namespace wrapcert::detail
