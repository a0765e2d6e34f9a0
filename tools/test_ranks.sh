#!/usr/bin/env bash
# `wrapcert certify` across ranks (torch.distributed's Gloo and TCPStore), as a user runs it.
#   tools/test_ranks.sh path/to/wrapcert path/to/rank_kinds_plugin.so GROUP
# GROUP: builtin   the built-in kinds at world sizes 2 and 4 (a reduced profile)
#        kinds     the plugin's correct kinds accepted, each faulty kind rejected by its property
#                  with a shrunk counterexample, at world sizes 2 and 4 (P17: trained across
#                  the ranks)
#        ends      a rank killed in a collective, a rank that hangs, a rank that enters a
#                  collective the others do not: the run ends within its limit naming the rank,
#                  the report written, no process and no file left
#        torchrun  two ranks started by hand with torchrun's variables
#        bad       a port in use, a rank that never joins, world sizes or seeds that differ, a
#                  store that cannot be reached: clear errors within the limit
# It finds the ranks it started by the plugin on their command line, and stops any it left:
# two groups at once would see each other's ranks, so ctest runs them one at a time
# (RESOURCE_LOCK), each beside the other tests.
set -uo pipefail
tool=$1 plugin=$2 group=$3
python=/usr/bin/python3  # Debian's, as the other test scripts use (not whatever PATH finds)
dir=$(mktemp -d)
# The ranks' log folders and store files go to $TMPDIR: a folder of this run's own, so that what
# other tests leave in /tmp at the same time is not taken for this run's.
export TMPDIR="$dir/tmp"
mkdir "$TMPDIR"
ranks="wrapcert certify .*$plugin"  # what a rank's command line looks like
trap 'pkill -KILL -f -- "$ranks" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run EXPECTED_EXIT ARGS...: output in $dir/out.txt
  local want=$1
  shift
  timeout 600 "$tool" "$@" > "$dir/out.txt" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { tail -n 60 "$dir/out.txt"; fail "wrapcert $* exited $got, not $want"; }
}
# entry REPORT PROPERTY_PREFIX STATUS: some entry of the JSON report has that status, and a
# failed one a counterexample.
entry() {
  "$python" - "$@" <<'EOF' || { cat "$dir/out.txt" | tail -n 40; fail "$2 in $1 is not $3"; }
import json, sys
report, prefix, status = sys.argv[1:4]
entries = [e for e in json.load(open(report))["entries"] if e["property"].startswith(prefix + " ")]
assert entries, "no entry for " + prefix
if status == "failed":
    bad = [e for e in entries if e["status"] == "failed"]
    assert bad, "none failed"
    assert all(e["counterexample"] for e in bad), "a failure without its counterexample"
else:
    assert all(e["status"] == status for e in entries), [e["reason"] for e in entries]
EOF
}
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
no_leftovers() {  # nothing of the run still running, no log folder or store file left
  sleep 0.5
  if pgrep -f -- "$ranks" >/dev/null; then pgrep -af -- "$ranks"; fail "a rank is still running"; fi
  local now
  now=$(ls -d "$TMPDIR"/wrapcert-ranks-* "$TMPDIR"/wrapcert-store-* 2>/dev/null | sort)
  [ "$now" = "$before" ] || fail "left behind: $(comm -13 <(echo "$before") <(echo "$now"))"
}
before=$(ls -d "$TMPDIR"/wrapcert-ranks-* "$TMPDIR"/wrapcert-store-* 2>/dev/null | sort)

case $group in
  builtin)
    run 0 certify --world-size 2 --cases 12 --seed 3 --quiet --json "$dir/w2.json"
    entry "$dir/w2.json" P4 passed
    grep -q "FullyShardedDataParallel\[sharded\]" "$dir/w2.json" || fail "FSDP[sharded] not run"
    grep -q "SpmdFullyShardedDataParallel\[sharded\]" "$dir/w2.json" || fail "SPMD not run"
    grep -q "FullyShardedDataParallel\[mixed\]" "$dir/w2.json" || fail "FSDP[mixed] not run"
    # Each rank a new process running the command line (as torchrun starts them), not a fork.
    run 0 certify --world-size 4 --exec-ranks --cases 6 --seed 4 --dtypes float32,bfloat16 --quiet \
      --json "$dir/w4.json"
    entry "$dir/w4.json" P1 passed
    grep -q "world size 4" "$dir/w4.json" || fail "not at world size 4"
    no_leftovers
    ;;
  kinds)
    for world in 2 4; do
      run 0 certify --plugin "$plugin" --world-size $world --cases 10 --seed 3 --quiet \
        --wrappers ShardRows ShardRowsSum MixedShardRows --dtypes float64,float32
      for fault in OffByOneShard:P1 OffByOneShard:P10 PaddingDropped:P1 GatherToWrongRank:P1 \
                   AveragingShard:P4 MixedBf16Reduce:P4 StateOnRank1:P1 ReleaseAddsOnRank1:P14 \
                   GatheredOnce:P17; do
        kind=${fault%%:*} property=${fault##*:}
        run 1 certify --plugin "$plugin" --world-size $world --cases 20 --seed 3 --quiet \
          --wrappers "$kind" --properties "$property" --dtypes float32 --json "$dir/$kind.json"
        entry "$dir/$kind.json" "$property" failed
      done
      grep -q "saves the wrapper state '.*_step', which rank 0 does not" "$dir/StateOnRank1.json" ||
        fail "declared state on one rank alone is not named"
      grep -q "the ranks' released state dicts differ: rank [01] saves '" \
        "$dir/ReleaseAddsOnRank1.json" || fail "a released state dict of one rank alone is not named"
      # Values gathered once at wrap time are right for one call: only training exposes them.
      grep -q "step 2 of 6, .*differs from .*one process's" "$dir/GatheredOnce.json" ||
        fail "stale gathered values are not caught after the first optimizer step"
    done
    run 0 certify --plugin "$plugin" --world-size 2 --cases 20 --seed 3 --quiet \
      --wrappers GatheredOnce --properties P1 P4 P13 P14 --dtypes float32
    no_leftovers
    ;;
  ends)
    # The log folders go to $TMPDIR (the leftovers checked below are looked for there): one
    # that is not there is named.
    TMPDIR="$dir/missing" run 2 certify --plugin "$plugin" --world-size 2 --cases 2 --seed 3 \
      --wrappers KillsRank1 --properties P4
    grep -q "cannot make a scratch folder in $dir/missing" "$dir/out.txt" || fail "a missing TMPDIR is not named"
    start=$(date +%s)
    run 1 certify --plugin "$plugin" --world-size 2 --cases 10 --seed 3 --timeout 20 \
      --wrappers KillsRank1 --properties P4 --dtypes float64 --json "$dir/kill.json"
    grep -q "rank 1 was killed by signal 9" "$dir/kill.json" || fail "the killed rank is not named"
    [ $(($(date +%s) - start)) -lt 60 ] || fail "the run outlived its limit after a rank died"
    no_leftovers
    start=$(date +%s)
    run 1 certify --plugin "$plugin" --world-size 2 --cases 10 --seed 3 --timeout 5 \
      --wrappers HangsRank1 --properties P4 --dtypes float64 --json "$dir/hang.json"
    grep -q "rank 1 hung" "$dir/hang.json" || fail "the hung rank is not named"
    grep -q "its last output" "$dir/hang.json" || fail "no last output"
    [ $(($(date +%s) - start)) -lt 40 ] || fail "the run outlived its limit with a hung rank"
    no_leftovers
    # A rank that enters a collective the others do not: the others wait in theirs, and fewer
    # collectives would name one of them. The rank whose collectives differ is named.
    for world in 3 4; do
      run 1 certify --plugin "$plugin" --world-size $world --cases 10 --seed 3 --timeout 5 \
        --wrappers ExtraOnRank1 --properties P4 --dtypes float64 --json "$dir/extra.json"
      "$python" - "$dir/extra.json" <<'EOF' || fail "the rank with another collective is not named"
import json, sys
e = json.load(open(sys.argv[1]))["entries"][0]
assert e["key"] == "rank 1", e["key"]
assert "rank 1 entered all_reduce_sum(1 Double)" in e["reason"], e["reason"]
assert "collectives differ at their collective" in e["reason"], e["reason"]
EOF
      no_leftovers
    done
    # A rank holding no row of a parameter that skips its gather: Gloo aborts a rank on a message
    # of another size; the report says where the ranks' collectives parted, and which ranks did
    # what.
    run 1 certify --plugin "$plugin" --world-size 4 --cases 10 --seed 3 --timeout 5 \
      --wrappers SkipsEmptyShard --properties P4 --dtypes float64 --json "$dir/skips.json"
    grep -q "the ranks' collectives differ at their collective" "$dir/skips.json" ||
      fail "a skipped collective is not named"
    no_leftovers
    ;;
  torchrun)
    port=$(free_port)
    for rank in 0 1; do
      RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout 300 "$tool" certify --wrappers DistributedDataParallel 'FullyShardedDataParallel[sharded]' \
        --cases 8 --seed 3 --quiet --json "$dir/rank$rank.json" --plugin "$plugin" \
        > "$dir/rank$rank.txt" 2>&1 &
      pids[$rank]=$!
    done
    wait "${pids[0]}" || { cat "$dir/rank0.txt"; fail "rank 0 failed"; }
    wait "${pids[1]}" || { cat "$dir/rank1.txt"; fail "rank 1 failed"; }
    entry "$dir/rank0.json" P4 passed
    [ ! -e "$dir/rank1.json" ] || fail "rank 1 wrote a report"
    # Under torchrun's agent: the agent serves the store (torch's own TCPStore here, in Python)
    # and the ranks' keys live under /worker/attempt_N, as init_process_group puts them.
    # (Debian's torchrun itself stops on Python 3.11 before starting a worker.)
    "$python" - "$tool" "$plugin" "$dir" <<'EOF' || fail "ranks under an agent store"
import datetime, os, subprocess, sys
from torch.distributed import TCPStore
tool, plugin, out = sys.argv[1:4]
store = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), False)
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE="2",
           TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="1")
ranks = [subprocess.Popen([tool, "certify", "--wrappers", "SpmdFullyShardedDataParallel[sharded]",
                           "--cases", "6", "--seed", "5", "--quiet", "--json", f"{out}/agent.json",
                           "--plugin", plugin],
                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
for r, p in enumerate(ranks):
    text = p.communicate(timeout=300)[0].decode()
    assert p.returncode == 0, f"rank {r} exited {p.returncode}: {text}"
store.set_timeout(datetime.timedelta(seconds=2))
assert store.get("/worker/attempt_1/wrapcert/world/1") == b"2", "keys not under the agent prefix"
assert os.path.getsize(f"{out}/agent.json") > 0
EOF
    no_leftovers
    ;;
  bad)
    # A port in use: rank 0 cannot serve the store there.
    port=$(free_port)
    "$python" -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(); time.sleep(30)" &
    holder=$!
    sleep 0.5
    RANK=0 WORLD_SIZE=1 MASTER_PORT=$port run 2 certify --wrappers DistributedDataParallel --seed 3 --cases 2 --timeout 5 --plugin "$plugin"
    grep -q "rank 0 cannot serve the store at 127.0.0.1:$port" "$dir/out.txt" || { cat "$dir/out.txt"; fail "port in use"; }
    kill $holder
    # A rank that never joins.
    port=$(free_port)
    start=$(date +%s)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port run 2 certify --seed 3 --cases 2 --timeout 3 --plugin "$plugin"
    grep -q "rank 0 of 2 could not join the others" "$dir/out.txt" || { cat "$dir/out.txt"; fail "a missing rank"; }
    [ $(($(date +%s) - start)) -lt 30 ] || fail "waited past the limit for a missing rank"
    # World sizes that differ.
    port=$(free_port)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port timeout 60 "$tool" certify --seed 3 --cases 2 --timeout 3 --plugin "$plugin" > "$dir/r0.txt" 2>&1 &
    r0=$!
    RANK=1 WORLD_SIZE=3 MASTER_PORT=$port run 2 certify --seed 3 --cases 2 --timeout 3 --plugin "$plugin"
    grep -q "rank 1 was started with world size 3, rank 0 with 2" "$dir/out.txt" || { cat "$dir/out.txt"; fail "world sizes"; }
    wait $r0 && fail "rank 0 went on without rank 1"
    # Seeds that differ.
    port=$(free_port)
    RANK=0 WORLD_SIZE=2 MASTER_PORT=$port timeout 60 "$tool" certify --seed 3 --cases 2 --timeout 5 --plugin "$plugin" > "$dir/r0.txt" 2>&1 &
    r0=$!
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port run 2 certify --seed 4 --cases 2 --timeout 5 --plugin "$plugin"
    grep -q "rank 1 was started with seed 4, rank 0 with 3" "$dir/out.txt" || { cat "$dir/out.txt"; fail "seeds"; }
    wait $r0
    grep -q "rank 1 was started with seed 4, rank 0 with 3" "$dir/r0.txt" || { cat "$dir/r0.txt"; fail "rank 0 on seeds"; }
    # No store where the master is said to be.
    port=$(free_port)
    start=$(date +%s)
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$port run 2 certify --seed 3 --cases 2 --timeout 3 --plugin "$plugin"
    grep -q "cannot reach the store at 127.0.0.1:$port" "$dir/out.txt" || { cat "$dir/out.txt"; fail "no store"; }
    [ $(($(date +%s) - start)) -lt 30 ] || fail "waited past the limit for the store"
    # Not a number.
    RANK=one WORLD_SIZE=2 run 2 certify --seed 3 --cases 2
    grep -q "RANK.*not a whole number" "$dir/out.txt" || { cat "$dir/out.txt"; fail "RANK=one"; }
    no_leftovers
    ;;
  *)
    fail "unknown group $group"
    ;;
esac
echo "ranks $group: ok"
