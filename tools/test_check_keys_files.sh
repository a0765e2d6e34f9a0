#!/usr/bin/env bash
# `wrapcert check-keys` on checkpoints as PyTorch 1.13 writes them in the wild
# (fixtures/golden/checkpoints): nested trainer dicts, the legacy format, shards with their
# index, a scan without a reference, a key listing; each fixed file read back by PyTorch's own
# torch.load (tools/torch_checkpoint_digest.py) and compared bit for bit with the clean
# checkpoint, ties included; destinations that are devices, FIFOs, folders or the input itself
# refused and left as they were; the CLI's exit codes.
#   tools/test_check_keys_files.sh path/to/wrapcert [python3 with torch]
set -uo pipefail
tool=$1
python=${2:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
golden=$(cd "$here/../fixtures/golden/checkpoints" && pwd)
digest="$here/torch_checkpoint_digest.py"
dir=$(mktemp -d)
# PyTorch's readings are forked from one interpreter that imported torch once (tools/preload.sh).
source "$here/preload.sh"
trap 'preload_stop; rm -rf "$dir"' EXIT
preload_start "$dir" "$python"
tool_preload_start "$dir" "$tool"
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run EXPECTED_EXIT OUTPUT_FILE ARGS...: the command's stdout and stderr into OUTPUT_FILE
  local want=$1 out=$2
  shift 2
  timeout 60 "$tool" "$@" > "$out" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { cat "$out"; fail "wrapcert $* exited $got, not $want"; }
}
# The clean checkpoint as PyTorch reads it, once.
"${py[@]}" "$digest" "$golden/clean_state_dict.pt" > "$dir/want.json" || fail "digest of clean"
# same_as_clean FILE [strides]: PyTorch reads FILE as exactly the clean checkpoint's tensors.
same_as_clean() {
  "${py[@]}" "$digest" "$1" > "$dir/got.json" || fail "torch cannot read $1"
  "$python" - "$dir/got.json" "$dir/want.json" "${2:-}" <<'PY' || fail "$1 differs from the clean checkpoint"
import json, sys
got, want = (json.load(open(p)) for p in sys.argv[1:3])
fields = ["dtype", "shape", "sha256"] + (["stride", "storage_offset"] if sys.argv[3] else [])
assert sorted(got["keys"]) == sorted(want["keys"]), (got["keys"], want["keys"])
for k in want["keys"]:
    for f in fields:
        assert got["tensors"][k][f] == want["tensors"][k][f], (k, f)
assert got["ties"] == want["ties"], (got["ties"], want["ties"])
PY
}

# A scan without a reference: wrapper components by whole component (exit 1), none (exit 0).
run 1 "$dir/scan.txt" check-keys "$golden/ddp.pt"
grep -q "module.embed.weight  (component 0: module)" "$dir/scan.txt" || fail "scan of ddp.pt"
run 1 "$dir/scan.txt" check-keys "$golden/checkpoint_wrapper.pt"
grep -q "block._checkpoint_wrapped_module.0.weight  (component 1: _checkpoint_wrapped_module)" \
  "$dir/scan.txt" || fail "scan of checkpoint_wrapper.pt"
run 0 "$dir/scan.txt" check-keys "$golden/tied.pt"
grep -q "head.weight = embed.weight" "$dir/scan.txt" || fail "the tie is not reported"

# DistributedDataParallel over gloo, fixed to torch.save and to safetensors.
run 1 "$dir/ddp.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/ddp_fixed.pt"
grep -q "module.block.0.weight -> block.0.weight" "$dir/ddp.txt" || fail "DDP translation"
same_as_clean "$dir/ddp_fixed.pt" strides
run 1 "$dir/ddp.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/ddp_fixed.safetensors"
same_as_clean "$dir/ddp_fixed.safetensors"
run 0 "$dir/ddp.txt" check-keys "$dir/ddp_fixed.safetensors" --against "$golden/clean_state_dict.pt"

# Nested checkpoints: the entry is found and named; the fix holds the state dict.
run 1 "$dir/trainer.txt" check-keys "$golden/trainer.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/trainer_fixed.pt"
grep -q "state dict in entry 'model'" "$dir/trainer.txt" || fail "the entry is not named"
grep -q "other entries, not checked: optimizer epoch best_loss" "$dir/trainer.txt" ||
  fail "the other entries are not named"
same_as_clean "$dir/trainer_fixed.pt" strides
run 0 "$dir/ds.txt" check-keys "$golden/deepspeed.pt" --against "$golden/clean_state_dict.pt"
grep -q "entry 'module'" "$dir/ds.txt" || fail "DeepSpeed's entry"
run 2 "$dir/entry.txt" check-keys "$golden/trainer.pt" --entry weights
grep -q "no entry 'weights' (entries: model, optimizer, epoch, best_loss)" "$dir/entry.txt" ||
  fail "a wrong --entry is not explained"

# The legacy format, nested, fixed to safetensors.
run 1 "$dir/legacy.txt" check-keys "$golden/legacy_trainer.pt" \
  --against "$golden/clean_state_dict.pt" --fix "$dir/legacy_fixed.safetensors"
grep -q "torch.save legacy" "$dir/legacy.txt" || fail "the legacy format is not named"
same_as_clean "$dir/legacy_fixed.safetensors"

# Shards with their index in, shards with an index out.
mkdir "$dir/out"
run 1 "$dir/sharded.txt" check-keys "$golden/sharded_bin" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/out/"
grep -q "wrote $dir/out/pytorch_model.bin.index.json" "$dir/sharded.txt" || fail "no index"
same_as_clean "$dir/out/pytorch_model.bin.index.json" strides
# Hugging Face leaves the tied head out of safetensors shards: a listing without it.
grep -v '^head.weight$' <("$python" -c "import json,sys; print('\n'.join(json.load(open(sys.argv[1]))['keys']))" "$dir/want.json") > "$dir/listing.txt"
run 1 "$dir/st.txt" check-keys "$golden/sharded_safetensors/model.safetensors.index.json" \
  --keys "$dir/listing.txt" --fix "$dir/st.safetensors.index.json"
[ -f "$dir/model-00002-of-00002.safetensors" ] || fail "the safetensors shards are not written"
run 0 "$dir/st.txt" check-keys "$dir/st.safetensors.index.json" --keys "$dir/listing.txt"

# A key listing: names compared, translation found, what differs printed.
run 1 "$dir/keys.txt" check-keys "$golden/ddp.pt" --keys <(tr ' ' '\n' <<<"steps scale_t embed.weight block.0.weight block.0.bias block.1.weight block.1.bias head.weight")
grep -q "module.head.weight -> head.weight" "$dir/keys.txt" || fail "--keys translation"
printf 'steps\nnot.there\n' > "$dir/short_listing.txt"
run 2 "$dir/keys.txt" check-keys "$golden/ddp.pt" --keys "$dir/short_listing.txt"
grep -q "not.there" "$dir/keys.txt" || fail "--keys does not print what is missing"

# Destinations that must never be written: devices, FIFOs, folders, links, the input.
run 73 "$dir/null.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix /dev/null
[ -c /dev/null ] || fail "/dev/null is no longer a device"
grep -q "/dev/null" "$dir/null.txt" || fail "the refusal does not name /dev/null"
! grep -q "status:" "$dir/null.txt" || fail "the destination was checked after reading"
mkfifo "$dir/fifo.pt"
run 73 "$dir/fifo.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/fifo.pt"
[ -p "$dir/fifo.pt" ] || fail "the FIFO destination was replaced"
run 66 "$dir/fifo.txt" check-keys "$dir/fifo.pt"
grep -q "is a FIFO" "$dir/fifo.txt" || fail "a FIFO input is not refused by type"
mkdir "$dir/folder.pt"
run 73 "$dir/dir.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/folder.pt"
cp "$golden/ddp.pt" "$dir/input.pt"
run 73 "$dir/self.txt" check-keys "$dir/input.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/input.pt"
grep -q "is the checkpoint being read" "$dir/self.txt" || fail "the input as destination"
cmp -s "$golden/ddp.pt" "$dir/input.pt" || fail "the input was changed"
run 64 "$dir/empty.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" --fix ''
run 73 "$dir/nofolder.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/none/x.pt"
! grep -q "status:" "$dir/nofolder.txt" || fail "an unwritable destination found after reading"
run 73 "$dir/ext.txt" check-keys "$golden/ddp.pt" --against "$golden/clean_state_dict.pt" \
  --fix "$dir/x.npz"
# In place: the input replaced atomically, still a torch.save file that torch.load reads.
run 1 "$dir/inplace.txt" check-keys "$dir/input.pt" --against "$golden/clean_state_dict.pt" \
  --in-place
same_as_clean "$dir/input.pt" strides

# The command line itself.
run 64 "$dir/cli.txt" frobnicate
grep -q "unknown command 'frobnicate'" "$dir/cli.txt" || fail "an unknown command is not named"
run 0 "$dir/cli.txt" --version
grep -q "^wrapcert [0-9]" "$dir/cli.txt" || fail "--version"
run 64 "$dir/cli.txt" check-keys "$golden/ddp.pt" --no-such-option
run 0 "$dir/cli.txt" --help
grep -q "64 usage error" "$dir/cli.txt" || fail "--help does not document the exit codes"
run 64 "$dir/cli.txt" check-keys "$golden/ddp.pt" --fix "$dir/x.pt"
run 2 "$dir/cli.txt" fixture tiny-gemma --save "$dir/meta.safetensors"
grep -q -- "--device cpu" "$dir/cli.txt" || fail "fixture --save on meta"
run 2 "$dir/cli.txt" demo --layers 1000 --hidden 4096
grep -q "needs about .* GB for its weights; this machine has" "$dir/cli.txt" ||
  fail "a demo that cannot fit in memory is not refused with its estimate"
echo "check-keys on real checkpoints: scans, nested, legacy, sharded, listings, refusals as expected"
