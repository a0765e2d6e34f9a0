# Sourced by the test scripts that start many Python processes importing torch: one interpreter
# imports it once (tools/python/wrapcert_preload.py) and each of those processes is forked from
# it, started as a new interpreter would start it (docs/python.md, "A preloaded interpreter").
#   preload_start DIR [PYTHON]  starts it (its socket in DIR), exports WRAPCERT_PYTHON_PRELOAD
#                               for certify-python's workers, and sets the array `py` to a
#                               command that runs a script there: "${py[@]}" SCRIPT ARGS... is
#                               PYTHON SCRIPT ARGS... (default /usr/bin/python3), exit status
#                               and signals included. Where it does not start, `py` is PYTHON.
#   preload_stop                stops it (from the script's EXIT trap)
preload_pid=""
preload_start() {
  local dir=$1 python=${2:-/usr/bin/python3}
  local script
  script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/python/wrapcert_preload.py"
  py=("$python")
  "$python" "$script" serve "$dir/preload.sock" > "$dir/preload.log" 2>&1 &
  preload_pid=$!
  local i
  for ((i = 0; i < 600; i++)); do  # the socket appears once torch is imported
    [ -S "$dir/preload.sock" ] && break
    kill -0 "$preload_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -S "$dir/preload.sock" ]; then
    export WRAPCERT_PYTHON_PRELOAD="$dir/preload.sock"
    py=("$python" "$script" run "$dir/preload.sock")
  else
    echo "note: the preloaded interpreter did not start; Python starts anew each time" >&2
    cat "$dir/preload.log" >&2
  fi
}
preload_stop() {
  [ -n "$preload_pid" ] && kill "$preload_pid" 2>/dev/null && wait "$preload_pid" 2>/dev/null
  preload_pid=""
  unset WRAPCERT_PYTHON_PRELOAD
  return 0
}
