#!/usr/bin/env bash
# `wrapcert certify-python` and `wrapcert check-dump` against real PyTorch (Debian's
# python3-torch), with exact exit codes and the rows each case must fail.
#   tools/test_certify_python.sh path/to/wrapcert GROUP
#   GROUP: torch (real torch wrappers pass), subjects (known wrong unwraps are rejected, with a
#   repro script that reproduces), wrappers (a sound Python wrapper passes, one per broken
#   contract is rejected), faults (a crash, a hang, an import that fails), dump (check-dump),
#   ranks (--world-size 2: DistributedDataParallel with a real all-reduce; reductions that are
#   wrong only across ranks rejected, with a repro run as two ranks; a killed and a hung rank),
#   xla (torch_xla's FSDPv2, where a TPU is found and torch_xla imports; else exit 77: skipped)
set -uo pipefail
tool=$1 group=$2
built_tool=$tool  # $tool may become a client of the tool's server (tools/preload.sh)
src=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$src/property_tests/python:$src/regression/python${PYTHONPATH:+:$PYTHONPATH}"
dir=$(mktemp -d)
# Every process this script starts carries the mark: none may be left when a run ends.
export WRAPCERT_TEST_MARK="$dir"
# One interpreter imports torch and the workers and repro scripts are forked from it
# (tools/preload.sh), but in the torch group: its workers start as new interpreters, as
# certify-python's do by default.
source "$src/tools/preload.sh"
py=(/usr/bin/python3)
trap 'preload_stop; rm -rf "$dir"' EXIT
if [ "$group" != torch ]; then
  preload_start "$dir"
  tool_preload_start "$dir" "$tool"
fi
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run EXPECTED_EXIT ARGS...: output in $dir/out.txt, report in $dir/report.json
  local want=$1
  shift
  rm -f "$dir/report.json"
  timeout 600 "$tool" "$@" > "$dir/out.txt" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { cat "$dir/out.txt"; fail "wrapcert $* exited $got, not $want"; }
}
certify() {  # certify EXPECTED_EXIT ARGS...: the rows that run the model in $dtypes (float64)
  local want=$1
  shift
  run "$want" certify-python --cases 40 --seed 7 --quiet --dtypes "${dtypes:-float64}" \
    --json "$dir/report.json" "$@"
  [ -s "$dir/report.json" ] || fail "no report for $*"
}
repro_as_two_ranks() {  # repro_as_two_ranks SCRIPT NAME: SCRIPT run as ranks 0 and 1 with
  # torchrun's variables (rank 0 serves the store); rank r's output in $dir/NAMEr.txt, its exit
  # status in codes[r]
  local script=$1 name=$2 port r pids=()
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=lo \
      timeout 120 "${py[@]}" "$script" > "$dir/$name$r.txt" 2>&1 &
    pids[r]=$!
  done
  for r in 0 1; do
    wait "${pids[r]}"
    codes[r]=$?
  done
}
failed_rows() {  # the failed rows as PROPERTY[/DTYPE], one line
  /usr/bin/python3 - "$dir/report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(" ".join(e["property"].split()[0] + ("/" + e["dtype"] if e.get("dtype") else "")
               for e in report["entries"] if e["status"] == "failed"))
PY
}
rows() {  # rows STATUS: the properties with that status, one line
  /usr/bin/python3 - "$dir/report.json" "$1" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(" ".join(e["property"].split()[0] for e in report["entries"] if e["status"] == sys.argv[2]))
PY
}
expect() {  # expect STATUS WHAT PROPERTY...: each named property has that status (failed, passed)
  local status=$1 what=$2 found
  shift 2
  found=" $(rows "$status") "
  for p in "$@"; do
    [[ "$found" == *" $p "* ]] || { cat "$dir/out.txt"; fail "$what: $p is not $status (those $status: $found)"; }
  done
}

case "$group" in
  torch)
    dtypes=float64,float32,bfloat16 certify 0 --wrapper torch.nn:DataParallel \
      --junit "$dir/report.xml" --markdown "$dir/report.md"
    expect passed "DataParallel, as wrapcert's kind models it" C++ P17
    [ "$(grep -c '"property": "P17 training"' "$dir/report.json")" -ge 3 ] || fail "no P17 row per dtype"
    grep -q "trained [0-9]* cases (P17: 3 optimizer steps" "$dir/report.md" || fail "the Markdown report says nothing of the training loop"
    grep -q "frozen parameters in [0-9]" "$dir/report.md" || fail "no frozen parameters drawn"
    grep -q '<testcase classname="torch.nn:DataParallel" name="P4 backward \[tiny-gemma (float64)\]"' "$dir/report.xml" || fail "no JUnit report"
    grep -q "reference (Python port)" "$dir/report.md" || fail "no Markdown report"
    # The worker's exit handlers run (it skips the interpreter's teardown): the folder of its
    # world-size-1 store is gone.
    mkdir "$dir/tmp"
    TMPDIR="$dir/tmp" certify 0 --wrapper DistributedDataParallel
    [ -z "$(ls -A "$dir/tmp")" ] || fail "the worker left $(ls "$dir/tmp") behind"
    # Not quiet: the console names the models DDP refused, by reason.
    run 0 certify-python --wrapper DistributedDataParallel --cases 40 --seed 7 --no-fixtures --dtypes float64
    grep -q "^note: [0-9]* of [0-9]* generated models with a wrapper refused ([0-9]* × DistributedDataParallel: RuntimeError: DistributedDataParallel is not needed" "$dir/out.txt" ||
      { cat "$dir/out.txt"; fail "the console does not list refusals"; }
    # torch 1.13's gloo has no bfloat16: DistributedDataParallel refuses every such model.
    dtypes=bfloat16 certify 1 --wrapper DistributedDataParallel --no-fixtures
    expect failed "DistributedDataParallel in bfloat16" P4 P17
    grep -q "DistributedDataParallel: RuntimeError: Invalid scalar type" "$dir/report.json" || fail "DDP's bfloat16 refusal is not named"
    certify 0 --wrapper checkpoint_wrapper
    certify 0 --wrapper DataParallel --wrapper checkpoint_wrapper
    # The reentrant checkpoint (torch 1.13's default) gives no gradient to a checkpointed
    # module whose inputs need none (an Embedding fed token ids), whatever the tolerance.
    certify 1 --wrapper 'checkpoint_wrapper[reentrant]' --tolerance 1e-12
    expect failed "reentrant checkpoint" P4
    grep -q "no gradient in the wrapped run" "$dir/report.json" || fail "the reentrant checkpoint's reason"
    echo "torch wrappers: certified"
    ;;
  subjects)
    certify 1 --wrapper DataParallel --unwrap known_unwraps:root_only --repro "$dir/repro.py"
    expect failed "root-only unwrap" P1 P2 P9 P10
    grep -q "n2 modules, [0-9] wrappers" "$dir/report.json" || fail "the root-only counterexample is not shrunk to 2 modules"
    "${py[@]}" "$dir/repro.py" > "$dir/repro.txt" 2>&1
    [ $? -eq 1 ] || { cat "$dir/repro.txt"; fail "the repro script does not exit 1"; }
    grep -q "PROBLEM: keys differ" "$dir/repro.txt" || fail "the repro script does not show the wrong keys"
    certify 1 --wrapper DataParallel --unwrap known_unwraps:duck_typed_recursive
    expect failed "duck-typed recursive unwrap" P1 P5 P9
    certify 1 --wrapper DataParallel --unwrap known_unwraps:copying
    expect failed "copying unwrap" P2
    # Permanent unwraps (P14): one that takes the wrappers out; a copy and a root-only one fail.
    certify 0 --wrapper DataParallel --wrapper checkpoint_wrapper --release releases:release
    expect passed "a release that takes every wrapper out" P14
    certify 1 --wrapper DataParallel --release releases:release_copy --repro "$dir/release.py"
    expect failed "a release of a copy" P14
    "${py[@]}" "$dir/release.py" > "$dir/release.txt" 2>&1
    [ $? -eq 1 ] && grep -q "^PROBLEM: .* is not the model's own tensor after release" "$dir/release.txt" ||
      { cat "$dir/release.txt"; fail "the release repro does not reproduce"; }
    grep -q "not the model's own tensor after release" "$dir/report.json" || fail "release_copy's reason"
    certify 1 --wrapper DataParallel --release releases:release_root
    expect failed "a release of the root only" P14
    echo "known unwraps: rejected, with a repro"
    ;;
  wrappers)
    certify 0 --wrapper wrappers_under_test:Sound
    certify 0 --wrapper wrappers_under_test:Noisy
    # A wrapcert kind that does not model the wrapper: its keys are not the wrapper's.
    certify 1 --wrapper wrappers_under_test:Sound --models wrappers_under_test:Sound=DataParallel
    expect failed "a kind that does not model the wrapper" C++
    expect passed "a kind that does not model the wrapper" P1 P2 P4
    certify 1 --wrapper wrappers_under_test:Copying --slot wrappers_under_test:Copying=inner
    expect failed "a wrapper of a copy" P2
    certify 1 --wrapper wrappers_under_test:copying --slot wrappers_under_test:copying=inner
    expect failed "a wrapper function that copies" P2
    certify 1 --wrapper wrappers_under_test:ExtraState
    expect failed "a wrapper with state of its own" P8
    expect passed "a wrapper with state of its own" P1 P2
    certify 1 --wrapper wrappers_under_test:Bypassing
    expect failed "a wrapper that bypasses" P4
    certify 1 --wrapper wrappers_under_test:NoGrad
    expect failed "a wrapper without autograd" P4
    certify 1 --wrapper wrappers_under_test:Unregistered
    expect failed "a wrapper that hides the module" P1
    grep -q "holds the module it wraps in no child of its own" "$dir/report.json" || fail "Unregistered's reason"
    certify 1 --wrapper wrappers_under_test:not_a_module
    grep -q "gave back a builtins.dict, not a torch.nn.Module" "$dir/report.json" || fail "a wrapper that gives back no module"
    # One fault each, rejected by the row named, with a repro that exits 1 saying what differs.
    contract() {  # contract WRAPPER ROW PROBLEM [ARGS...]: certify fails ROW; the repro shows PROBLEM
      local wrapper=$1 row=$2 problem=$3
      shift 3
      rm -f "$dir/repro.py"
      certify 1 --wrapper "wrappers_under_test:$wrapper" --repro "$dir/repro.py" "$@"
      expect failed "$wrapper" "$row"
      [ -s "$dir/repro.py" ] || fail "$wrapper: no repro script"
      "${py[@]}" "$dir/repro.py" > "$dir/repro.txt" 2>&1
      local code=$?
      [ "$code" -eq 1 ] || { cat "$dir/repro.txt"; fail "$wrapper: the repro exited $code, not 1"; }
      grep -q "^PROBLEM: $problem" "$dir/repro.txt" || { cat "$dir/repro.txt"; fail "$wrapper: the repro does not show '$problem'"; }
    }
    # The width and the batch are drawn (1 to 8, 1 to 5): squeezed, the output of one example
    # (a batch of 1 shrinks to it) loses its batch dimension.
    contract SqueezesBatch P4 "the wrapped output has shape \[[0-9]*\] where the model's has \[1, [0-9]\] (a batch)" --max-size 1
    grep -q "has shape \[[0-9]*\] where the model's has \[1, *[0-9]\] (a batch)" "$dir/report.json" || fail "SqueezesBatch's reason"
    grep -q "on a batch of 1" "$dir/report.json" || fail "SqueezesBatch is not shrunk to a batch of 1"
    contract refuses P1 "the wrapper wrappers_under_test:refuses refused the model"
    grep -q "refused [0-9]* of the [0-9]* generated models that had a wrapper (more than half): [0-9]* × wrappers_under_test:refuses: ValueError" "$dir/report.json" || fail "refusals are not counted by reason"
    contract NonPersistentState P15 "the wrapper wrappers_under_test:NonPersistentState holds a non-persistent buffer 'mask'"
    certify 0 --wrapper wrappers_under_test:NonPersistentState --owned-state wrappers_under_test:NonPersistentState=mask
    contract RenamesNestedKeys P8 "keys mapping: the wrapped key .*\\.w translates to"
    contract StorageCast P2 ".* is the model's tensor object, but its values no longer live in the model's storage"
    contract ScalesGradients P4 "the gradient of .* differs in the wrapped run"
    contract NoGrad P4 "the wrapped model does not run"
    contract ExtraState P8 "keys mapping: the wrapped key steps translates to steps"
    expect failed "ExtraState" P15
    # Declared, its counter is its own (P8 passes), but two ExtraStates stacked save two
    # counters under one key.
    certify 1 --wrapper wrappers_under_test:ExtraState --owned-state wrappers_under_test:ExtraState=steps
    expect passed "ExtraState, declared" P8
    grep -q "the ExtraState's own 'steps' and its slot's 'inner.steps' translate to one key" "$dir/report.json" || fail "stacked own state"
    # Aliases (P16): DDP's `.module` is its slot; WrongAlias's reaches the wrapper itself.
    certify 0 --wrapper DistributedDataParallel --alias DistributedDataParallel=module
    expect passed "DDP's alias" P16
    contract WrongAlias P16 "the wrapper wrappers_under_test:WrongAlias's alias 'module' does not reach" \
      --alias wrappers_under_test:WrongAlias=module
    grep -q "alias 'module' reaches a WrongAlias, not the module in its slot 'inner'" "$dir/report.json" || fail "WrongAlias' reason"
    # How models are trained: one fault per dimension, rejected by the row named (shrunk to the
    # value that exposes it), with a repro that shows it; the correct ones pass.
    certify 0 --wrapper wrappers_under_test:ForwardingTrain --no-fixtures
    certify 0 --wrapper wrappers_under_test:ExactNoGrad --no-fixtures
    contract Unfreezing P2 ".*: requires_grad is True after wrapping and unwrapping, the model's False" --no-fixtures
    grep -q "frozen (requires_grad=False): " "$dir/report.json" || fail "Unfreezing's counterexample names no frozen key"
    expect failed "Unfreezing" P4 P17
    contract StuckInTraining P2 ".* is in training mode after model.train(False) through the wrappers" --no-fixtures
    grep -q "run in eval mode" "$dir/report.json" || fail "StuckInTraining's counterexample is not in eval mode"
    contract NoGradScale P17 "step 2 of 6 (no_grad, batch of 1): the output through the wrappers differs" --no-fixtures
    expect passed "NoGradScale" P2 P4
    contract StaleGather P17 "step 2 of 6 (no_grad, batch of 1): the output through the wrappers differs" --no-fixtures
    expect passed "StaleGather" P4
    contract OptimizerBreaking P17 "an optimizer given the wrapped model's parameters raised ValueError" --no-fixtures
    grep -q "step 1 of 6, .*: the optimizer step over the wrapped model's parameters raised" "$dir/report.json" || fail "OptimizerBreaking's step"
    contract LargeBatchFault P4 "the wrapped output differs (a batch)" --no-fixtures
    grep -q "on a batch of 3" "$dir/report.json" || fail "LargeBatchFault is not shrunk to a batch of 3"
    dtypes=float64,float32,bfloat16 certify 1 --wrapper wrappers_under_test:BFloat16Fault --no-fixtures
    [ "$(failed_rows)" = "P4/bfloat16 P17/bfloat16" ] || fail "BFloat16Fault: failed $(failed_rows)"
    # Correct ones: a forward pre-hook of its own; the module also kept in a plain list.
    certify 0 --wrapper wrappers_under_test:PreHooked
    # (RC_PARAMS names another seed, as CI's does: the run's --seed replaces it.)
    RC_PARAMS="seed=99 max_size=100" certify 0 --wrapper wrappers_under_test:ListedBeside
    # A wrapper no wrapcert kind models: nothing to compare in "C++ agreement", no case spent.
    /usr/bin/python3 - "$dir/report.json" <<'PY' || fail "C++ agreement is not skipped for a wrapper no kind models"
import json, sys
e = [e for e in json.load(open(sys.argv[1]))["entries"] if e["property"] == "C++ agreement"][0]
sys.exit(not (e["status"] == "skipped" and e["cases"] == 0 and "--models" in e["reason"]))
PY
    # Messages: rapidcheck's line names the run's seed; replay lines carry PYTHONPATH; --help
    # shows defaults; P5 names the wrapped model before unwrap, not the model.
    grep -q "Using configuration: seed=7" "$dir/out.txt" || fail "rapidcheck names another seed"
    "$tool" certify-python --help | grep -q -- "--cases INT:INT in \[1 - 1000000\]=100" || fail "--help shows no defaults"
    certify 1 --wrapper DataParallel --unwrap known_unwraps:duck_typed_recursive
    grep -q "PYTHONPATH=$src/property_tests/python" "$dir/report.json" || fail "the replay line lacks PYTHONPATH"
    grep -q "where the wrapped model before has" "$dir/report.json" || fail "P5 does not name the wrapped model"
    echo "Python wrappers: the sound one certified, each faulty one rejected"
    ;;
  faults)
    certify 1 --wrapper wrappers_under_test:Crashing --repro "$dir/crash.py"
    grep -q "killed by signal 11" "$dir/report.json" || fail "a crash is not named"
    grep -q "wrappers_under_test.py.*line [0-9]* in __init__" "$dir/report.json" || fail "no Python traceback for a crash"
    [ -s "$dir/crash.py" ] || fail "no repro for a crash"
    certify 1 --wrapper wrappers_under_test:Hanging --timeout 3
    grep -q "gave no reply within 3 s" "$dir/report.json" || fail "a hang is not named"
    grep -q "in __init__" "$dir/report.json" || fail "no Python stack for a hang"
    run 2 certify-python --wrapper no_such_module:Wrapper --cases 2
    grep -q "no_such_module:Wrapper" "$dir/out.txt" || fail "a wrapper that does not import is not named"
    run 2 certify-python --wrapper DataParallel --unwrap known_unwraps:no_such_function --cases 2
    grep -q "known_unwraps:no_such_function" "$dir/out.txt" || fail "a subject that does not import is not named"
    run 64 certify-python --wrapper DataParallel --slot nothing
    run 2 certify-python --wrapper DataParallel --models DataParallel=NoSuchKind
    grep -q "NoSuchKind" "$dir/out.txt" || fail "an unknown kind in --models is not named"
    WRAPCERT_PYTHON=/nonexistent/python run 2 certify-python --wrapper DataParallel --cases 2
    grep -q "WRAPCERT_PYTHON" "$dir/out.txt" || fail "a missing interpreter is not explained"
    # A worker that answers the start, then (one fault per process it is started as) prints
    # garbage, raises, exits.
    mkdir "$dir/fake"
    cat > "$dir/fake/wrapcert_worker.py" <<'PY'
import json, os, sys
print(json.dumps({"ready": True}), flush=True)
count = os.path.join(os.path.dirname(__file__), "starts")
starts = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(starts + 1))
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "resolve":
        print(json.dumps({"id": req["id"], "ok": True, "torch": "fake"}), flush=True)
    elif starts == 0:
        print("this is not JSON", flush=True)
    elif starts == 1:
        raise RuntimeError("the fake worker gives up")
    else:
        sys.exit(3)
PY
    WRAPCERT_PYTHON_DIR="$dir/fake" certify 1 --wrapper DataParallel
    grep -q "replied with something that is not its reply: 'this is not JSON'" "$dir/report.json" || fail "garbage is not named"
    grep -q "the Python worker exited with status 1" "$dir/report.json" || fail "a worker that raises is not named"
    grep -q "the fake worker gives up" "$dir/report.json" || fail "no traceback from a worker that raises"
    grep -q "the Python worker exited with status 3" "$dir/report.json" || fail "a worker that exits is not named"
    # The time limit covers a case, not the interpreter's start: a worker that takes 4 s to
    # start passes with --timeout 3, and fails to start, saying so, with --start-timeout 1.
    mkdir "$dir/slow"
    cat > "$dir/slow/wrapcert_worker.py" <<PY
import runpy, sys, time
time.sleep(4)
sys.argv[0] = "$(dirname "$built_tool")/share/wrapcert/python/wrapcert_worker.py"
runpy.run_path(sys.argv[0], run_name="__main__")
PY
    WRAPCERT_PYTHON_DIR="$dir/slow" certify 0 --wrapper DataParallel --timeout 3
    WRAPCERT_PYTHON_DIR="$dir/slow" run 2 certify-python --wrapper DataParallel --start-timeout 1
    grep -q "did not start within 1 s" "$dir/out.txt" || fail "a slow start is not named as such"
    echo "worker faults: each a verdict or a clear error"
    ;;
  dump)
    for c in data_parallel checkpoint user_module; do
      "${py[@]}" "$src/tools/torch_tree_dump.py" "$c" --out "$dir/$c.json" || fail "dump $c"
      run 0 check-dump "$dir/$c.json"
    done
    "${py[@]}" "$src/tools/torch_tree_dump.py" --model tree_dump_models:tied_pair \
        --wrap DataParallel --out "$dir/own.json" || fail "dump of a user's model"
    run 0 check-dump "$dir/own.json"
    grep -q "pass P1" "$dir/out.txt" || fail "check-dump prints no verdicts"
    echo '{"nodes": 3}' > "$dir/bad.json"
    run 2 check-dump "$dir/bad.json"
    run 2 check-dump "$dir/missing.json"
    echo "dumps: checked"
    ;;
  ranks)
    # (But the preloaded interpreter and the processes of its own that wait on a worker: a
    # worker forked there carries the mark too.)
    left_running() {
      local p
      for p in /proc/[0-9]*; do
        case "${p#/proc/}" in "$preload_pid" | "$tool_server_pid") continue ;; esac
        case "$(awk '/^PPid:/ {print $2}' "$p/status" 2>/dev/null)" in
          "$preload_pid" | "$tool_server_pid") continue ;;
        esac
        { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qx "WRAPCERT_TEST_MARK=$dir" &&
          echo "${p#/proc/}: $({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null)"
      done
    }
    certify 0 --wrapper DistributedDataParallel --world-size 2
    grep -q '"P4 backward"' "$dir/report.json" || fail "no P4 row across ranks"
    grep -q "2 processes" "$dir/out.txt" || { cat "$dir/out.txt"; fail "not two ranks"; }
    # No all-reduce at all: exact at world size 1, each rank keeping its own gradients at 2.
    certify 0 --wrapper wrappers_under_test:LocalGradients
    certify 1 --wrapper wrappers_under_test:LocalGradients --world-size 2 --repro "$dir/local.py"
    expect failed "a DistributedDataParallel that reduces nothing" P4
    expect passed "a DistributedDataParallel that reduces nothing" P1 P2 P8
    grep -q "is not the mean over the 2 ranks" "$dir/report.json" || fail "LocalGradients' reason"
    grep -q -- "--world-size 2" "$dir/report.json" || fail "the replay line lacks --world-size"
    # The repro runs as two ranks with torchrun's variables (rank 0 serves the store) and
    # exits 1 on each, saying what differs there.
    repro_as_two_ranks "$dir/local.py" local
    for r in 0 1; do
      [ "${codes[r]}" -eq 1 ] || { cat "$dir/local$r.txt"; fail "rank $r of the repro exited ${codes[r]}, not 1"; }
      grep -q "PROBLEM (rank $r): the gradient of .* is not the mean" "$dir/local$r.txt" ||
        { cat "$dir/local$r.txt"; fail "rank $r of the repro shows no PROBLEM"; }
    done
    "${py[@]}" "$dir/local.py" > "$dir/alone.txt" 2>&1
    [ $? -eq 1 ] && grep -q "runs at world size 2, not 1" "$dir/alone.txt" || fail "the repro alone"
    # Trained across ranks (P17): DistributedDataParallel at world size 3 (the two reductions
    # add in other orders there); a replica that rank 1 refreshes from values taken at wrap time
    # passes one call and fails the training loop, naming the rank; exact at world size 1.
    certify 0 --wrapper DistributedDataParallel --world-size 3
    expect passed "DistributedDataParallel trained at world size 3" P17
    certify 0 --wrapper wrappers_under_test:StaleReplicaOnRank1
    certify 1 --wrapper wrappers_under_test:StaleReplicaOnRank1 --world-size 2 --repro "$dir/stale.py"
    expect failed "a replica stale on rank 1" P17
    expect passed "a replica stale on rank 1" P1 P2 P4
    grep -q "rank 1: step [0-9] of 6, .*differs" "$dir/report.json" ||
      fail "the training loop across ranks does not name rank 1's step"
    # Its repro, run as the two ranks, fails on rank 1 at the step the report names (rank 0
    # may fail later: rank 1's gradients reach it through the all-reduce).
    repro_as_two_ranks "$dir/stale.py" stale
    step=$(grep -o "rank 1: step [0-9]" "$dir/report.json" | head -n 1 | grep -o "[0-9]$")
    [ "${codes[1]}" -eq 1 ] &&
      head -n 1 <(grep "^PROBLEM" "$dir/stale1.txt") | grep -q "PROBLEM (rank 1): step $step of 6 " ||
      { cat "$dir/stale1.txt"; fail "the training repro does not fail on rank 1 at step $step"; }
    # A comm hook that sums: wrong for DistributedDataParallel's mean, right where declared.
    certify 1 --wrapper wrappers_under_test:SummingGradients --world-size 2
    expect failed "a DistributedDataParallel that sums" P4
    certify 0 --wrapper wrappers_under_test:SummingGradients --world-size 2 \
      --reduction wrappers_under_test:SummingGradients=sum
    run 64 certify-python --wrapper DataParallel --reduction DataParallel=max
    # A buffer on rank 1 alone: every row with a wrapper fails naming the rank, the fixtures'
    # too; the repro, run as the two ranks, exits 1 on rank 1 alone.
    certify 1 --wrapper wrappers_under_test:StateOnRank1 --world-size 2 --repro "$dir/ranks.py"
    /usr/bin/python3 - "$dir/report.json" <<'PY' || fail "a rank disagreement leaves a row passing"
import json, sys
rows = [e for e in json.load(open(sys.argv[1]))["entries"] if e["status"] != "skipped"]
wrong = [(e["property"], e["target"]) for e in rows if e["property"] != "P9 no false positives"
         and (e["status"] != "failed" or "rank 1's wrapped model has other keys" not in e["reason"])]
fixtures = [e for e in rows if e["target"] == "tiny-gemma" and e["status"] == "failed"]
print("rows left passing:", wrong) if wrong else None
sys.exit(1 if wrong or not fixtures else 0)
PY
    repro_as_two_ranks "$dir/ranks.py" ranks
    for r in 0 1; do
      [ "${codes[r]}" -eq "$r" ] || { cat "$dir/ranks$r.txt"; fail "rank $r of the disagreement's repro exited ${codes[r]}, not $r"; }
    done
    grep -q "PROBLEM (rank 1): this rank's wrapped model has other keys than rank 0's" "$dir/ranks1.txt" ||
      { cat "$dir/ranks1.txt"; fail "rank 1 of the repro does not name the disagreement"; }
    # A rank killed, a rank hung: failed rows naming the rank, reports written, nothing left.
    certify 1 --wrapper wrappers_under_test:KillsRank1 --world-size 2 --timeout 20
    grep -q "rank 1: the Python worker was killed by signal 9" "$dir/report.json" || fail "the killed rank is not named"
    [ -z "$(left_running)" ] || fail "processes left after a killed rank: $(left_running)"
    start=$(date +%s)
    certify 1 --wrapper wrappers_under_test:HangsRank1 --world-size 2 --timeout 5
    took=$(( $(date +%s) - start ))
    grep -q "rank 1: the Python worker gave no reply within 5 s" "$dir/report.json" || fail "the hung rank is not named"
    grep -q "in __init__" "$dir/report.json" || fail "no Python stack for the hung rank"
    [ "$took" -le 60 ] || fail "a hung rank took $took s to end"
    [ -z "$(left_running)" ] || fail "processes left after a hung rank: $(left_running)"
    echo "ranks: DistributedDataParallel certified with a real all-reduce; wrong reductions rejected"
    ;;
  xla)
    if ! "$tool" hardware --json |
        /usr/bin/python3 -c 'import json, sys; sys.exit(not json.load(sys.stdin)["tpu"]["present"])'; then
      echo "skipped: no TPU (wrapcert hardware)"
      exit 77
    fi
    if ! /usr/bin/python3 -c "import torch_xla" 2>/dev/null; then
      echo "skipped: a TPU, but torch_xla does not import"
      exit 77
    fi
    certify 0 --wrapper SpmdFullyShardedDataParallel
    expect passed "torch_xla's FSDPv2" P1 P2 P8
    echo "torch_xla FSDPv2: certified"
    ;;
  *)
    fail "unknown group $group"
    ;;
esac
