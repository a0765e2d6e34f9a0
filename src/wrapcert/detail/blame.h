#pragma once
/// Who threw, for failure messages: code that runs or builds a model notes the innermost culprit
/// as an exception passes through it (`call` notes the module whose forward threw, generated
/// trees the kind whose `make` threw); a property takes the note when it reports the exception.

#include <string>

namespace wrapcert::detail {

/// Keeps `who` unless a note is already there (the innermost culprit is noted first).
void note_blame(std::string who);
/// The note, cleared: "" when nothing was noted since the last call.
std::string take_blame();

}  // namespace wrapcert::detail
