#!/usr/bin/env bash
# `wrapcert check-keys` as a pipeline runs it: a checkpoint saved from the seed's wrapped model
# is fixable (exit 1), --fix writes a clean one (exit 0), a wrong model is broken (exit 2), and
# a damaged file is an error naming the file (exit 2).
# Also a checkpoint that PyTorch's own DataParallel saved (fixtures/golden/torch_save), and a
# --fix run killed mid-write by the kernel (RLIMIT_FSIZE): the old file stays whole.
#   tools/test_check_keys.sh path/to/wrapcert
set -uo pipefail
tool=$1
golden=$(cd "$(dirname "$0")/../fixtures/golden/torch_save" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$tool" fixture tiny-gemma --wrapped --device cpu --save "$dir/wrapped.safetensors" || fail "save"
"$tool" check-keys "$dir/wrapped.safetensors" --fixture tiny-gemma --fix "$dir/clean.safetensors" \
  > "$dir/out.txt"
[ $? -eq 1 ] || fail "a wrapped checkpoint should be fixable"
grep -q "_orig_module.model.layers.0._orig_module.mlp.up_proj.weight -> model.layers.0.mlp.up_proj.weight" \
  "$dir/out.txt" || fail "the translation is not reported"
"$tool" check-keys "$dir/clean.safetensors" --fixture tiny-gemma > /dev/null
[ $? -eq 0 ] || fail "the fixed checkpoint should be clean"
"$tool" check-keys "$dir/clean.safetensors" --fixture tiny-mistral > /dev/null
[ $? -eq 2 ] || fail "another model's checkpoint should be broken"
head -c 20 "$dir/clean.safetensors" > "$dir/damaged.safetensors"
"$tool" check-keys "$dir/damaged.safetensors" --fixture tiny-gemma 2> "$dir/err.txt"
[ $? -eq 2 ] || fail "a damaged file should fail"
grep -q "damaged.safetensors" "$dir/err.txt" || fail "the error should name the file"
"$tool" check-keys "$golden/data_parallel.pt" --against "$golden/state_dict.pt" \
  --fix "$dir/dp.safetensors" > "$dir/dp.txt"
[ $? -eq 1 ] || fail "PyTorch's DataParallel checkpoint should be fixable"
grep -q "module.block.0.weight -> block.0.weight" "$dir/dp.txt" || fail "DataParallel translation"
"$tool" check-keys "$dir/dp.safetensors" --against "$golden/state_dict.pt" > /dev/null
[ $? -eq 0 ] || fail "the fixed DataParallel checkpoint should be clean"

# Kill --fix mid-write: with a 4 KiB file-size limit the write past it is SIGXFSZ (exit 153).
cp "$dir/clean.safetensors" "$dir/before.safetensors"
entries=$(ls -A "$dir" | wc -l)
(ulimit -f 4; exec "$tool" check-keys "$dir/wrapped.safetensors" --fixture tiny-gemma \
  --fix "$dir/clean.safetensors" > /dev/null 2>&1)
[ $? -eq 153 ] || fail "the --fix run was not killed by SIGXFSZ"
cmp -s "$dir/before.safetensors" "$dir/clean.safetensors" || fail "the killed run damaged the file"
[ "$(ls -A "$dir" | wc -l)" -eq "$entries" ] || fail "the killed run left a file behind"
echo "check-keys: fixable, fixed, clean, broken, damaged and killed cases as expected"
