#!/usr/bin/env python3
"""`wrapcert check-keys --fix/--in-place` on training output as PyTorch 1.13 writes it, checked
with PyTorch's own torch.load: nothing the trainer saved is lost, and every file wrapcert writes
loads with weights_only=True (the default of torch.load since PyTorch 2.6).

    /usr/bin/python3 tools/test_check_keys_training.py path/to/wrapcert

Each case writes its checkpoint into a fresh folder, runs the tool and compares what torch.load
reads with what was saved. Exit 0 when every case passes; the last line counts them."""
import argparse
import collections
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
import zipfile

import torch
import torch.nn as nn

TOOL = sys.argv[1]
# The command that runs the tool: main() points it at a server of the tool's that forks each
# run (tools/python/wrapcert_preload.py, `serve_tool`).
COMMAND = [TOOL]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.head = nn.Linear(4, 6, bias=False)
        self.register_buffer("steps", torch.tensor([3]))


def trained():
    """A model, its Adam state after one real step, and a GradScaler's state."""
    torch.manual_seed(0)
    model = Tiny()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.head(model.block(model.embed(torch.tensor([[0, 1, 2]])))).square().mean().backward()
    adam.step()
    return model, adam


def prefixed(state, prefix):
    return collections.OrderedDict((prefix + k, v) for k, v in state.items())


def run(*args, want):
    done = subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == want, f"wrapcert {' '.join(args)} exited {done.returncode}:\n{out}"
    return out


def same(a, b, where=""):
    """Deep equality of what torch.load gives: tensors by dtype, shape and values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a.keys()) == list(b.keys()), (where, a.keys(), b.keys())
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


class StateDictOnly(pickle.Unpickler):
    """Unpickles what Python's torch.save writes for a state dict and nothing else: the classes
    current PyTorch's weights_only loader accepts for it (LibTorch's own pickler adds
    torch.jit._pickle.restore_type_tag, which PyTorch 2.6 refuses)."""

    ALLOWED = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return collections.OrderedDict if name == "OrderedDict" else self.rebuild
        if module == "torch" and name.endswith("Storage"):
            return name
        raise pickle.UnpicklingError(f"{module}.{name} is not what torch.save writes")

    @staticmethod
    def rebuild(storage, offset, size, stride, requires_grad, hooks):
        return ("tensor", storage, offset, tuple(size), tuple(stride))

    def persistent_load(self, pid):
        assert pid[0] == "storage" and pid[3] == "cpu", pid
        return pid[2]


def load_weights_only(path):
    """torch.load(path, weights_only=True), and the pickle holds what torch.save writes alone."""
    with zipfile.ZipFile(path) as z:
        pkl = [n for n in z.namelist() if n.endswith("/data.pkl")]
        assert len(pkl) == 1, z.namelist()
        StateDictOnly(io.BytesIO(z.read(pkl[0]))).load()
    return torch.load(path, weights_only=True)


def write_safetensors(path, state, metadata):
    """A safetensors file as the safetensors library lays it out (its JSON header, the data)."""
    names = {torch.float32: "F32", torch.int64: "I64", torch.float16: "F16"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for k, t in state.items():
        data = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def trainer_checkpoint(legacy):
    model, adam = trained()
    return {
        "model": prefixed(model.state_dict(), "_orig_mod.module."),
        "optimizer": adam.state_dict(),
        "scaler": {"scale": 65536.0, "growth_factor": 2.0, "_growth_tracker": 12},
        "epoch": 3,
        "rng_state": torch.get_rng_state(),
        "note": b"bytes \x00 kept",
    }, model


def case_in_place_keeps_every_trainer_entry(d, legacy):
    saved, model = trainer_checkpoint(legacy)
    path = os.path.join(d, "last.ckpt")
    torch.save(saved, path, _use_new_zipfile_serialization=not legacy)
    torch.save(model.state_dict(), os.path.join(d, "clean.pt"))
    out = run("check-keys", path, "--against", os.path.join(d, "clean.pt"), "--in-place", want=1)
    assert "kept the entries beside the state dict, unchanged: optimizer scaler epoch" in out, out
    back = torch.load(path)
    assert list(back.keys()) == list(saved.keys()), back.keys()
    same(back["model"], model.state_dict(), "model")
    for entry in ("optimizer", "scaler", "epoch", "rng_state", "note"):
        same(back[entry], saved[entry], entry)
    run("check-keys", path, "--against", os.path.join(d, "clean.pt"), want=0)


def case_in_place_zip(d):
    case_in_place_keeps_every_trainer_entry(d, legacy=False)


def case_in_place_legacy(d):
    case_in_place_keeps_every_trainer_entry(d, legacy=True)


def case_fix_of_a_python_file_loads_with_weights_only(d):
    model, _ = trained()
    src = os.path.join(d, "ddp.pt")
    torch.save(prefixed(model.state_dict(), "module."), src)
    torch.save(model.state_dict(), os.path.join(d, "clean.pt"))
    run("check-keys", src, "--against", os.path.join(d, "clean.pt"), "--fix",
        os.path.join(d, "fixed.bin"), want=1)
    same(load_weights_only(os.path.join(d, "fixed.bin")), model.state_dict())


def case_safetensors_to_torch_save_loads_with_weights_only(d):
    model, _ = trained()
    state = model.state_dict()
    src = os.path.join(d, "model.safetensors")
    write_safetensors(src, prefixed(state, "_fsdp_wrapped_module."), {"format": "pt"})
    torch.save(state, os.path.join(d, "clean.pt"))
    fixed = os.path.join(d, "fixed.pt")
    run("check-keys", src, "--against", os.path.join(d, "clean.pt"), "--fix", fixed, want=1)
    back = load_weights_only(fixed)
    assert type(back) is collections.OrderedDict, type(back)
    same(dict(back), dict(state))


def case_a_tie_through_safetensors_and_back_to_torch_save(d):
    model, _ = trained()
    model.head.weight = model.embed.weight  # tied, as a language model's head
    clean = model.state_dict()
    src = os.path.join(d, "src.pt")
    torch.save(prefixed(clean, "_orig_mod.module."), src)
    listing = os.path.join(d, "keys.txt")
    with open(listing, "w") as f:
        f.write("\n".join("module." + k for k in clean) + "\n")
    mid = os.path.join(d, "mid.safetensors")
    run("check-keys", src, "--keys", listing, "--fix", mid, want=1)
    torch.save(clean, os.path.join(d, "clean.pt"))
    out = os.path.join(d, "out.pt")
    run("check-keys", mid, "--against", os.path.join(d, "clean.pt"), "--fix", out, want=1)
    back = load_weights_only(out)
    same(dict(back), dict(clean))
    assert back["head.weight"].data_ptr() == back["embed.weight"].data_ptr(), "the tie is lost"


def case_safetensors_metadata_is_kept(d):
    model, _ = trained()
    state = model.state_dict()
    src = os.path.join(d, "model.safetensors")
    meta = {"format": "pt", "step": "1200", "base_model": "tiny/base", "note": "kept"}
    write_safetensors(src, prefixed(state, "_orig_module."), meta)
    listing = os.path.join(d, "keys.txt")
    with open(listing, "w") as f:
        f.write("\n".join(state.keys()) + "\n")
    run("check-keys", src, "--keys", listing, "--in-place", want=1)
    got = read_safetensors_metadata(src)
    for k, v in meta.items():
        assert got.get(k) == v, (k, got)
    run("check-keys", src, "--keys", listing, want=0)


def case_sharded_in_place_keeps_the_index_metadata(d):
    model, _ = trained()
    state = prefixed(model.state_dict(), "module.")
    keys = list(state.keys())
    shards = {"pytorch_model-00001-of-00002.bin": keys[:3], "pytorch_model-00002-of-00002.bin": keys[3:]}
    weight_map = {}
    for name, part in shards.items():
        torch.save(collections.OrderedDict((k, state[k]) for k in part), os.path.join(d, name))
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = os.path.join(d, "pytorch_model.bin.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": total, "created_by": "trainer"},
                   "weight_map": weight_map}, f)
    torch.save(model.state_dict(), os.path.join(d, "clean.pt"))
    run("check-keys", d, "--against", os.path.join(d, "clean.pt"), "--in-place", want=1)
    with open(index) as f:
        written = json.load(f)
    assert written["metadata"] == {"total_size": total, "created_by": "trainer"}, written
    assert set(written["weight_map"]) == set(model.state_dict()), written
    got = {}
    for name in sorted(set(written["weight_map"].values())):
        got.update(load_weights_only(os.path.join(d, name)))
    same(dict(sorted(got.items())), dict(sorted(model.state_dict().items())))
    leftovers = [n for n in os.listdir(d) if n.startswith(".")]
    assert not leftovers, leftovers


def save_clean(d, model):
    path = os.path.join(d, "clean.pt")
    torch.save(model.state_dict(), path)
    return path


def case_trainer_folder_is_checked_among_its_training_state(d):
    model, adam = trained()
    ckpt = os.path.join(d, "checkpoint-500")
    os.mkdir(ckpt)
    write_safetensors(os.path.join(ckpt, "model.safetensors"), model.state_dict(), {"format": "pt"})
    torch.save(adam.state_dict(), os.path.join(ckpt, "optimizer.pt"))
    torch.save({"last_epoch": 1, "_step_count": 2}, os.path.join(ckpt, "scheduler.pt"))
    torch.save({"cpu": torch.get_rng_state()}, os.path.join(ckpt, "rng_state.pth"))
    torch.save(argparse.Namespace(output_dir="out", learning_rate=1e-3),
               os.path.join(ckpt, "training_args.bin"))
    with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
        json.dump({"global_step": 500}, f)
    out = run("check-keys", ckpt, "--against", save_clean(d, model), want=0)
    assert ("files beside the weights, not checked: optimizer.pt rng_state.pth scheduler.pt "
            "trainer_state.json training_args.bin") in out, out


def deepspeed_states(state, zero3):
    module = collections.OrderedDict(
        (k, torch.empty(0, dtype=v.dtype) if zero3 and v.is_floating_point() else v)
        for k, v in state.items())
    return {"module": module, "buffer_names": ["steps"], "optimizer": None,
            "param_shapes": [collections.OrderedDict((k, v.shape) for k, v in state.items())],
            "lr_scheduler": None, "global_steps": 10, "dp_world_size": 2, "mp_world_size": 1,
            "ds_version": "0.9.5"}


def case_deepspeed_root_is_followed_through_latest(d):
    model, adam = trained()
    step = os.path.join(d, "global_step10")
    os.mkdir(step)
    torch.save(deepspeed_states(model.state_dict(), zero3=False),
               os.path.join(step, "mp_rank_00_model_states.pt"))
    for rank in (0, 1):
        torch.save({"optimizer_state_dict": adam.state_dict()},
                   os.path.join(step, f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("global_step10")
    with open(os.path.join(d, "zero_to_fp32.py"), "w") as f:
        f.write("# DeepSpeed's script\n")
    out = run("check-keys", d, "--against", save_clean(d, model), want=0)
    assert "followed DeepSpeed's 'latest' to global_step10" in out, out
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in out, out


def case_zero3_placeholders_are_named_with_the_way_out(d):
    model, _ = trained()
    path = os.path.join(d, "zero_pp_rank_0_mp_rank_00_model_states.pt")
    torch.save(deepspeed_states(model.state_dict(), zero3=True), path)
    out = run("check-keys", path, want=2)
    assert "ZeRO-3 placeholder" in out and "zero_to_fp32.py" in out, out
    assert "embed.weight" in out, out
    out = run("check-keys", path, "--against", save_clean(d, model), want=2)
    assert "ZeRO-3 placeholder" in out, out


def case_fsdp_flat_parameters_are_named(d):
    flat = torch.zeros(40)
    for name, keys in {"local.pt": ["_fsdp_wrapped_module.flat_param"],
                       "params.pt": ["_fsdp_wrapped_module._fpw_module.flat_param",
                                     "_fsdp_wrapped_module._fpw_module.head._fsdp_wrapped_module"
                                     "._flat_param"]}.items():
        path = os.path.join(d, name)
        torch.save(collections.OrderedDict((k, flat) for k in keys), path)
        out = run("check-keys", path, want=2)
        assert "a flat parameter" in out and "FULL_STATE_DICT" in out, out
    assert "component 1: _fpw_module" in out, out


def case_hub_folder_prefers_safetensors(d):
    model, _ = trained()
    write_safetensors(os.path.join(d, "model.safetensors"), model.state_dict(), {"format": "pt"})
    torch.save(prefixed(model.state_dict(), "stale."), os.path.join(d, "pytorch_model.bin"))
    clean = save_clean(os.path.join(d, ".."), model)
    out = run("check-keys", d, "--against", clean, want=0)
    assert "safetensors weights preferred" in out and "pytorch_model.bin" in out, out


def case_a_tied_head_left_out_is_tied_not_missing(d):
    model, _ = trained()
    model.head.weight = model.embed.weight
    tying = save_clean(d, model)
    saved = collections.OrderedDict(
        (k, v) for k, v in prefixed(model.state_dict(), "module.").items()
        if k != "module.head.weight")
    path = os.path.join(d, "without_head.pt")
    torch.save(saved, path)
    out = run("check-keys", path, "--against", tying, "--fix", os.path.join(d, "fixed.pt"), want=1)
    assert "tied keys left out" in out and "head.weight = embed.weight" in out, out
    assert "missing" not in out, out
    out = run("check-keys", os.path.join(d, "fixed.pt"), "--against", tying, want=0)


def case_complex_buffers_and_extra_state_pass_through(d):
    model, _ = trained()
    state = model.state_dict()
    state["rotary"] = torch.polar(torch.ones(3), torch.arange(3.0))  # complex64
    state["block._extra_state"] = 5
    state["head._extra_state"] = b"\x00fp8 meta"
    path = os.path.join(d, "te.pt")
    torch.save(prefixed(state, "module."), path)
    run("check-keys", path, want=1)
    clean = os.path.join(d, "clean.pt")
    torch.save(state, clean)
    run("check-keys", clean, "--against", clean, want=0)
    run("check-keys", path, "--against", clean, "--in-place", want=1)
    back = torch.load(path)
    same(dict(back), dict(state))
    out = run("check-keys", path, "--against", clean, "--fix", os.path.join(d, "x.safetensors"),
              want=3)
    assert "safetensors" in out and "write torch.save" in out, out


def case_compile_over_ddp_is_flagged_as_a_whole(d):
    model, _ = trained()
    path = os.path.join(d, "compiled.pt")
    torch.save(prefixed(model.state_dict(), "_orig_mod.module."), path)
    out = run("check-keys", path, want=1)
    assert "_orig_mod.module.embed.weight  (component 1: module)" in out, out


def case_distinct_answers(d):
    model, _ = trained()
    clean = save_clean(d, model)
    empty = os.path.join(d, "empty.txt")
    open(empty, "w").close()
    out = run("check-keys", clean, "--keys", empty, want=66)
    assert "holds no key" in out, out
    run("check-keys", clean, "--keys", os.path.join(d, "none.txt"), want=66)
    run("check-keys", os.path.join(d, "none.pt"), want=66)
    with open(os.path.join(d, "damaged.pt"), "wb") as f:
        f.write(open(clean, "rb").read()[:300])
    run("check-keys", os.path.join(d, "damaged.pt"), want=2)
    out = run("check-keys", clean, "--against", clean, "--fix", os.path.join(d, "c.safetensors"),
              want=0)
    assert "nothing to fix" in out and "wrote" in out, out
    copy = os.path.join(d, "copy.pt")
    with open(copy, "wb") as f:
        f.write(open(clean, "rb").read())
    out = run("check-keys", copy, "--against", clean, "--in-place", want=0)
    assert "nothing to do" in out, out


def read_safetensors_plain(path):
    """Every tensor the header promises, as the safetensors library's load_file reads them."""
    names = {"F32": torch.float32, "I64": torch.int64, "F64": torch.float64, "F16": torch.float16}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[b:end]), dtype=names[e["dtype"]]).reshape(
            e["shape"])
    return out, header.get("__metadata__", {})


def case_ties_in_safetensors_once_or_as_copies(d):
    model, _ = trained()
    model.head.weight = model.embed.weight
    clean = save_clean(d, model)
    src = os.path.join(d, "ddp.pt")
    torch.save(prefixed(model.state_dict(), "module."), src)
    once = os.path.join(d, "once.safetensors")
    out = run("check-keys", src, "--against", clean, "--fix", once, want=1)
    assert "stored once, the other keys left out as Transformers saves them" in out, out
    tensors, meta = read_safetensors_plain(once)
    assert "head.weight" not in tensors and "head.weight" in meta["wrapcert.aliases"], meta
    copy = os.path.join(d, "copy.safetensors")
    out = run("check-keys", src, "--against", clean, "--fix", copy, "--ties", "copy", want=1)
    assert "each key stored as its own copy" in out, out
    tensors, meta = read_safetensors_plain(copy)
    same(dict(sorted(tensors.items())), dict(sorted(model.state_dict().items())))
    assert "wrapcert.aliases" not in meta, meta


CASES = [(name, fn) for name, fn in sorted(globals().items()) if name.startswith("case_")
         and name != "case_in_place_keeps_every_trainer_entry"]


def serve_tool():
    """Points COMMAND at a server of the tool's; returns the server (None where it did not
    start) and the folder of its socket."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
    import wrapcert_preload
    folder = tempfile.mkdtemp(prefix="wrapcert-tool-")
    server, COMMAND[:] = wrapcert_preload.serve_tool(TOOL, folder)
    return server, folder


def main(cases=None, only=()):
    """Runs `cases` (default: this file's), those whose names contain one of `only` where it is
    given, with the tool served."""
    server, folder = serve_tool()
    try:
        return run_cases(CASES if cases is None else cases, only)
    finally:
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def run_cases(cases, only=()):
    passed = failed = 0
    for name, fn in cases:
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
