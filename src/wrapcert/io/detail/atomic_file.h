#pragma once
/// Writing a file so that nothing is lost when a run is interrupted: the bytes go to an unnamed
/// (or temporary) file in the destination's folder, which is synced and then renamed over the
/// destination. A reader, or a run killed at any point, sees either the old file whole or the
/// new one whole.
///
///   wrapcert::write_file_atomically("report.json", text);
///   wrapcert::write_file_atomically("model.safetensors", [&](std::ostream& out) { ... });
///
/// A file that existed keeps its permission bits; a new one gets 0666 less the umask. Only a
/// regular file or a new path is written: a device, FIFO, socket, folder or symbolic link at the
/// destination is an `Error` (kInvalidArgument) and is left as it is.

#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

namespace wrapcert {

/// Calls `write` with a stream into the new file, then moves it into place. If `write` throws,
/// or writing fails, the destination is untouched, nothing is left behind, and the error
/// propagates (a write failure is an `Error` naming `path`).
void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write);

void write_file_atomically(const std::string& path, std::string_view contents);

/// Gives the regular file `source` a second name, `destination` (in the same file system),
/// replacing what is there in one step: a reader sees the old file or the new one, never none.
/// `source` keeps its name. Only a regular file or a new path is replaced.
void link_atomically(const std::string& source, const std::string& destination);

}  // namespace wrapcert
