#pragma once
// `wrapcert serve-forks SOCKET`: a tool that has loaded LibTorch once and runs each command line
// sent to it in a forked child, started the way a new process of the tool starts (docs/python.md,
// "A preloaded tool").

#include <string>

namespace wrapcert::cli {

/// The command line of the tool, as `main` runs it.
using CommandLine = int (*)(int argc, char** argv);

/// Serves on the Unix socket `path` (a new path) until SIGTERM; each request runs `run` in a
/// forked child with the client's arguments, streams, environment and folder. Returns the exit
/// code of the server (64 for a socket path that exists, 71 where it cannot listen).
int serve_forks(const std::string& path, CommandLine run);

}  // namespace wrapcert::cli
