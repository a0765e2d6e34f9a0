#!/usr/bin/env python3
"""`wrapcert check-keys` on the layouts training tools write beyond single files and Transformers'
folders: Hugging Face Hub cache snapshots, torch.distributed.checkpoint folders, files holding
several state dicts (EMA), TorchScript archives, pickled modules, Megatron, diffusers and NeMo;
each written with PyTorch 1.13 as the tool writes it (a stand-in where the tool is not installed
here), checked, fixed, and the fixed output loaded with the tool's own loader where there is one.

    /usr/bin/python3 tools/test_check_keys_layouts.py path/to/wrapcert

Exit 0 when every case passes; the last line counts them."""
import json
import os
import sys
import tempfile
import traceback

import torch

from test_check_keys_training import prefixed, run, same, save_clean, trained, write_safetensors


def hub_snapshot(d, files):
    """A Hub cache as huggingface_hub lays it out: every file of a snapshot a relative symbolic
    link into the model's `blobs`, named by content hash. `files`: name -> writer(path)."""
    repo = os.path.join(d, "hub", "models--org--tiny")
    snap = os.path.join(repo, "snapshots", "0123abcd")
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(snap)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0123abcd")
    for i, (name, write) in enumerate(sorted(files.items())):
        blob = os.path.join(repo, "blobs", f"{i:040x}")
        write(blob)
        link = os.path.join(snap, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    return snap


def text(content):
    def write(path):
        with open(path, "w") as f:
            f.write(content)
    return write


def case_hub_snapshot_links_are_followed_within_the_cache(d):
    model, _ = trained()
    state = model.state_dict()
    snap = hub_snapshot(d, {
        "model.safetensors": lambda p: write_safetensors(p, prefixed(state, "module."),
                                                         {"format": "pt"}),
        "config.json": text("{}"),
        "tokenizer.json": text("{}"),
    })
    clean = save_clean(d, model)
    out = run("check-keys", snap, "--against", clean, want=1)
    assert "module.embed.weight -> embed.weight" in out, out
    assert "files beside the weights, not checked: config.json tokenizer.json" in out, out
    # The snapshot's file is a link: --in-place refuses to write through it; --fix writes a copy.
    out = run("check-keys", snap, "--against", clean, "--in-place", want=73)
    assert "not a regular file" in out, out
    fixed = os.path.join(d, "fixed.safetensors")
    run("check-keys", snap, "--against", clean, "--fix", fixed, want=1)
    run("check-keys", fixed, "--against", clean, want=0)


def case_hub_sharded_snapshot_with_its_index(d):
    model, _ = trained()
    state = prefixed(model.state_dict(), "_orig_mod.")
    keys = list(state)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [keys[:3], keys[3:]]
    index = {"metadata": {"total_size": 0},
             "weight_map": {k: names[i] for i, part in enumerate(parts) for k in part}}
    files = {name: (lambda part: lambda p: write_safetensors(
        p, {k: state[k] for k in part}, {"format": "pt"}))(part) for name, part in zip(names, parts)}
    files["model.safetensors.index.json"] = text(json.dumps(index))
    snap = hub_snapshot(d, files)
    os.mkdir(os.path.join(d, "out"))
    out = run("check-keys", snap, "--against", save_clean(d, model), "--fix",
              os.path.join(d, "out") + "/", want=1)
    assert "2 shards by its index" in out, out
    run("check-keys", os.path.join(d, "out"), "--against", os.path.join(d, "clean.pt"), want=0)


def case_links_leaving_the_cache_and_loops_are_refused_by_name(d):
    model, _ = trained()
    outside = os.path.join(d, "outside.safetensors")
    write_safetensors(outside, model.state_dict(), {"format": "pt"})
    snap = hub_snapshot(d, {"config.json": text("{}")})
    os.symlink(outside, os.path.join(snap, "model.safetensors"))
    out = run("check-keys", snap, want=2)
    assert "model.safetensors" in out and "leads out of" in out, out
    os.unlink(os.path.join(snap, "model.safetensors"))
    os.symlink("loop_b", os.path.join(snap, "loop_a.safetensors"))
    os.symlink("loop_a.safetensors", os.path.join(snap, "loop_b"))
    out = run("check-keys", snap, want=2)
    assert "a symbolic link loop" in out and "loop_" in out, out
    # A plain folder: a link within it is followed, one out of it refused.
    plain = os.path.join(d, "plain")
    os.mkdir(plain)
    write_safetensors(os.path.join(plain, "weights.data"), model.state_dict(), {"format": "pt"})
    os.symlink("weights.data", os.path.join(plain, "model.safetensors"))
    out = run("check-keys", plain, want=0)
    assert "files beside the weights, not checked: weights.data" in out, out
    os.symlink(outside, os.path.join(plain, "other.safetensors"))
    out = run("check-keys", plain, want=2)
    assert "other.safetensors" in out and "leads out of" in out, out


def case_accelerate_save_state_lists_every_file_it_keeps(d):
    model, adam = trained()
    folder = os.path.join(d, "checkpoint_3")
    os.mkdir(folder)
    torch.save(prefixed(model.state_dict(), "module."), os.path.join(folder, "pytorch_model.bin"))
    torch.save(adam.state_dict(), os.path.join(folder, "optimizer.bin"))
    torch.save({"last_epoch": 1}, os.path.join(folder, "scheduler.bin"))
    torch.save({"scale": 1024.0}, os.path.join(folder, "scaler.pt"))
    torch.save({"random_state": (3, (1, 2), None), "torch_manual_seed": torch.get_rng_state()},
               os.path.join(folder, "random_states_0.pkl"))
    torch.save({"step": 7}, os.path.join(folder, "custom_checkpoint_0.pkl"))
    clean = save_clean(d, model)
    out = run("check-keys", folder, "--against", clean, "--in-place", want=1)
    assert ("files beside the weights, not checked: custom_checkpoint_0.pkl optimizer.bin "
            "random_states_0.pkl scaler.pt scheduler.bin") in out, out
    same(dict(torch.load(os.path.join(folder, "pytorch_model.bin"))), dict(model.state_dict()))
    assert torch.load(os.path.join(folder, "custom_checkpoint_0.pkl")) == {"step": 7}


CASES = [(name, fn) for name, fn in sorted(globals().items()) if name.startswith("case_")]


def main():
    only = sys.argv[2:]
    passed = failed = 0
    for name, fn in CASES:
        if only and not any(o in name for o in only):
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                fn(d)
                passed += 1
                print(f"ok    {name}")
            except Exception:  # noqa: BLE001 - every failure is reported, the run goes on
                failed += 1
                print(f"FAIL  {name}\n{traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
