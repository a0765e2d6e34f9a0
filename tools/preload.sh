# Sourced by the test scripts that start many Python processes importing torch: one interpreter
# imports it once (tools/python/wrapcert_preload.py) and each of those processes is forked from
# it, started as a new interpreter would start it (docs/python.md, "A preloaded interpreter").
#   preload_start DIR [PYTHON]  starts it (its socket in DIR), exports WRAPCERT_PYTHON_PRELOAD
#                               for certify-python's workers, and sets the array `py` to a
#                               command that runs a script there: "${py[@]}" SCRIPT ARGS... is
#                               PYTHON SCRIPT ARGS... (default /usr/bin/python3), exit status
#                               and signals included. Where it does not start, `py` is PYTHON.
#   preload_stop                stops it (from the script's EXIT trap), and the tool's server
#   tool_preload_start DIR TOOL starts `TOOL serve-forks` (its socket in DIR), which forks each
#                               run of the tool from a process that loaded LibTorch once, and
#                               sets `tool` to a command file in DIR that runs TOOL ARGS...
#                               there, exit status and signals included (where the server
#                               refuses or does not start, TOOL itself runs)
preload_pid=""
wait_for_socket() {  # wait_for_socket SOCKET PID TRIES PAUSE: true once SOCKET listens
  local i
  for ((i = 0; i < $3; i++)); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep "$4"
  done
  [ -S "$1" ]
}
preload_start() {
  local dir=$1 python=${2:-/usr/bin/python3}
  local script
  script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python/wrapcert_preload.py"
  py=("$python")
  "$python" "$script" serve "$dir/preload.sock" > "$dir/preload.log" 2>&1 &
  preload_pid=$!
  if wait_for_socket "$dir/preload.sock" "$preload_pid" 600 0.1; then  # once torch is imported
    export WRAPCERT_PYTHON_PRELOAD="$dir/preload.sock"
    py=("$python" "$script" run "$dir/preload.sock")
  else
    echo "note: the preloaded interpreter did not start; Python starts anew each time" >&2
    cat "$dir/preload.log" >&2
  fi
}
tool_server_pid=""
tool_preload_start() {
  local dir=$1 real
  real="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
  local script
  script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python/wrapcert_preload.py"
  tool=$real
  "$real" serve-forks "$dir/tool.sock" < /dev/null > "$dir/tool-server.log" 2>&1 &
  tool_server_pid=$!
  if wait_for_socket "$dir/tool.sock" "$tool_server_pid" 300 0.02; then
    printf '#!/bin/sh\nexec /usr/bin/python3 -S %q run-program %q %q "$@"\n' \
      "$script" "$dir/tool.sock" "$real" > "$dir/wrapcert"
    chmod +x "$dir/wrapcert"
    tool="$dir/wrapcert"
  else
    echo "note: the tool's server did not start; the tool starts anew each time" >&2
    cat "$dir/tool-server.log" >&2
  fi
}
preload_stop() {
  [ -n "$preload_pid" ] && kill "$preload_pid" 2>/dev/null && wait "$preload_pid" 2>/dev/null
  preload_pid=""
  [ -n "$tool_server_pid" ] && kill "$tool_server_pid" 2>/dev/null &&
    wait "$tool_server_pid" 2>/dev/null
  tool_server_pid=""
  unset WRAPCERT_PYTHON_PRELOAD
  return 0
}
