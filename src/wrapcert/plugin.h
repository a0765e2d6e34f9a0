#pragma once
/// Wrapper kinds in a shared library, for `wrapcert certify --plugin libmy_kinds.so`: the library
/// defines one entry point that registers its kinds.
///
///   WRAPCERT_PLUGIN(registry) {
///     registry.add(wrapcert::wrapper_kind<MyShardImpl>("MyShard", "_sharded_module"));
///   }
///
/// Build it as a CMake MODULE library linked to `wrapcert::plugin` (wrapcert's headers and
/// LibTorch): the wrapcert code it calls is that of the program that loads it.

#include <wrapcert/registry.h>

#include <string>
#include <vector>

/// The entry point's name, as `dlsym` finds it.
#define WRAPCERT_PLUGIN_ENTRY "wrapcert_register_kinds"
/// Defines the entry point; the body adds the library's kinds to `registry` (the parameter's
/// name, so it takes no parentheses).
// NOLINTNEXTLINE(bugprone-macro-parentheses)
#define WRAPCERT_PLUGIN(registry)                                                 \
  extern "C" __attribute__((visibility("default"))) void wrapcert_register_kinds( \
      ::wrapcert::Registry& registry)

namespace wrapcert {

/// Loads the library at `path` and registers its kinds in `registry`; returns their names in
/// the order registered. Throws `Error` naming the path (kInvalidArgument) when it cannot be
/// loaded, lacks the entry point, throws, or registers no kind, and (kDuplicateKind) naming the
/// kind when one clashes with a kind already registered; `registry` is then left as it was.
std::vector<std::string> load_plugin(const std::string& path,
                                     Registry& registry = Registry::global());

}  // namespace wrapcert
