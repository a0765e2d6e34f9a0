#!/usr/bin/env python3
"""`wrapcert check-keys` on the layouts training tools write beyond single files and Transformers'
folders: Hugging Face Hub cache snapshots, torch.distributed.checkpoint folders, files holding
several state dicts (EMA), TorchScript archives, pickled modules, Megatron, diffusers and NeMo;
each written with PyTorch 1.13 as the tool writes it (a stand-in where the tool is not installed
here), checked, fixed, and the fixed output loaded with the tool's own loader where there is one.

    /usr/bin/python3 tools/test_check_keys_layouts.py path/to/wrapcert

Exit 0 when every case passes; the last line counts them."""
import collections
import io
import json
import os
import shutil
import sys
import tarfile

import torch

import dcp_standin
import test_check_keys_training
from test_check_keys_training import (COMMAND, prefixed, read_safetensors_plain, run, same,
                                      save_clean, trained, write_safetensors)


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


def case_every_state_dict_in_a_file_is_checked_and_fixed(d):
    """timm's train.py saves the model and its EMA side by side; both carry the DDP prefix."""
    model, adam = trained()
    ema = {k: v * 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    path = os.path.join(d, "last.pth.tar")
    saved = {"epoch": 3, "arch": "tiny", "state_dict": prefixed(model.state_dict(), "module."),
             "optimizer": adam.state_dict(), "version": 2,
             "state_dict_ema": prefixed(ema, "module.")}
    torch.save(saved, path)
    clean = save_clean(d, model)
    out = run("check-keys", path, "--against", clean, want=1)
    assert "more state dicts in the file, each checked below: state_dict_ema" in out, out
    assert "other entries, not checked: epoch arch optimizer version" in out, out
    assert "state dict in entry 'state_dict_ema' (7 keys)" in out, out
    assert out.count("module.embed.weight -> embed.weight") == 2, out
    fixed = os.path.join(d, "fixed.pt")
    run("check-keys", path, "--against", clean, "--fix", fixed, want=1)
    back = torch.load(fixed)
    assert list(back) == list(saved), list(back)
    same(dict(back["state_dict"]), dict(model.state_dict()), "state_dict")
    same(dict(back["state_dict_ema"]), ema, "state_dict_ema")
    same(back["optimizer"], saved["optimizer"], "optimizer")
    run("check-keys", fixed, "--against", clean, want=0)
    # safetensors holds one state dict: refused by name, nothing written; --entry chooses one.
    out = run("check-keys", path, "--against", clean, "--fix", os.path.join(d, "x.safetensors"),
              want=3)
    assert "2 state dicts (state_dict, state_dict_ema)" in out, out
    assert not os.path.exists(os.path.join(d, "x.safetensors"))
    run("check-keys", path, "--against", clean, "--entry", "state_dict_ema", "--fix",
        os.path.join(d, "ema.safetensors"), want=1)
    # One state dict fixable, the other broken: nothing written, exit 2.
    saved["state_dict_ema"] = prefixed(ema, "other.")
    saved["state_dict_ema"]["extra"] = torch.zeros(1)
    torch.save(saved, path)
    out = run("check-keys", path, "--against", clean, "--in-place", want=2)
    assert "nothing written" in out, out


def case_pickled_modules_are_named_with_the_way_out(d):
    model, _ = trained()
    whole = os.path.join(d, "model.pt")
    torch.save(model, whole)
    out = run("check-keys", whole, want=3)
    assert "a pickled module of class 'test_check_keys_training.Tiny'" in out and "state_dict()" in out, out
    nested = os.path.join(d, "detection.pth")
    torch.save({"model": model, "epoch": 3}, nested)
    out = run("check-keys", nested, want=3)
    assert "entry 'model' holds a pickled module" in out, out
    out = run("check-keys", nested, "--entry", "model", want=3)
    assert "pickled module" in out, out


def case_torchscript_is_named_with_the_way_out(d):
    model, _ = trained()
    path = os.path.join(d, "scripted.pt")
    torch.jit.save(torch.jit.script(model), path)
    out = run("check-keys", path, want=3)
    assert "TorchScript" in out and "torch.jit.load(path).state_dict()" in out, out


def case_a_sharded_tensor_in_a_local_state_dict_is_named(d):
    """FSDP's LOCAL_STATE_DICT holds each flat parameter as a ShardedTensor, pickled (PyTorch
    2.x) as a tensor subclass through torch._tensor._rebuild_from_type_v2; its class stands in
    here for the one this PyTorch cannot import."""
    import types
    for name in ("torch.distributed._shard", "torch.distributed._shard.sharded_tensor",
                 "torch.distributed._shard.sharded_tensor.api"):
        sys.modules.setdefault(name, types.ModuleType(name))
    api = sys.modules["torch.distributed._shard.sharded_tensor.api"]

    class ShardedTensor(torch.Tensor):
        pass
    ShardedTensor.__module__, ShardedTensor.__qualname__ = api.__name__, "ShardedTensor"
    api.ShardedTensor = ShardedTensor
    flat = torch.zeros(8).as_subclass(ShardedTensor)
    flat.local_shards = [torch.zeros(8)]  # state beside the data, as the real class keeps
    path = os.path.join(d, "local.pt")
    torch.save({"_fsdp_wrapped_module.flat_param": flat}, path)
    out = run("check-keys", path, want=3)
    assert "_fsdp_wrapped_module.flat_param" in out and "ShardedTensor" in out, out
    assert "LOCAL_STATE_DICT" in out and "FULL_STATE_DICT" in out, out


def megatron_state(state):
    """Megatron-LM's GPTModel.state_dict_for_save_checkpoint: dicts nested by submodule."""
    return {"language_model": {
        "embedding": {"word_embeddings": {"weight": state["embed.weight"]}},
        "encoder": collections.OrderedDict((k, v) for k, v in state.items()
                                           if k.startswith("block.")),
        "output_layer": {"weight": state["head.weight"]}}}


def case_megatron_nested_model_dicts(d):
    model, adam = trained()
    state = model.state_dict()
    saved = {"args": None, "checkpoint_version": 3.0, "iteration": 10,
             "model": megatron_state(state), "optimizer": adam.state_dict(),
             "rng_state": [{"random_rng_state": (3, (1, 2), None)}]}
    path = os.path.join(d, "model_optim_rng.pt")
    torch.save(saved, path)
    out = run("check-keys", path, want=0)
    assert "state dict in entry 'model'" in out, out
    listing = os.path.join(d, "keys.txt")
    want = ["language_model.embedding.word_embeddings.weight"] + [
        "language_model.encoder." + k for k in state if k.startswith("block.")] + [
        "language_model.output_layer.weight"]
    with open(listing, "w") as f:
        f.write("\n".join(want) + "\n")
    run("check-keys", path, "--keys", listing, want=0)
    out = run("check-keys", path, "--entry", "model.language_model", want=0)
    assert "(torch.save zip, state dict in entry 'model.language_model'" in out, out
    # Wrapped below the nesting (Megatron's own DDP in a layer): fixed, the dicts kept.
    saved["model"]["language_model"]["encoder"] = prefixed(
        saved["model"]["language_model"]["encoder"], "module.")
    torch.save(saved, path)
    out = run("check-keys", path, "--keys", listing, "--in-place", want=1)
    back = torch.load(path)
    assert list(back["model"]["language_model"]["encoder"]) == [
        k for k in state if k.startswith("block.")], back["model"]
    same(back["optimizer"], saved["optimizer"], "optimizer")
    # A translation that would rename a nested dict is refused, nothing written.
    with open(listing, "w") as f:
        f.write("\n".join(w.replace("language_model.", "lm.") for w in want) + "\n")
    before = open(path, "rb").read()
    out = run("check-keys", path, "--keys", listing, "--in-place", want=2)
    assert open(path, "rb").read() == before


def case_megatron_folder_through_its_latest_iteration(d):
    model, adam = trained()
    state = model.state_dict()
    root = os.path.join(d, "checkpoints")
    for rank in ("mp_rank_00", "mp_rank_01"):
        os.makedirs(os.path.join(root, "iter_0000010", rank))
        torch.save({"iteration": 10, "model": megatron_state(state)},
                   os.path.join(root, "iter_0000010", rank, "model_optim_rng.pt"))
        torch.save({"param_state": 1}, os.path.join(root, "iter_0000010", rank, "distrib_optim.pt"))
    os.makedirs(os.path.join(root, "iter_0000005", "mp_rank_00"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("10")
    out = run("check-keys", root, want=0)
    assert "followed Megatron's latest_checkpointed_iteration.txt to iter_0000010" in out, out
    assert "mp_rank_00 is checked" in out, out
    assert ("files beside the weights, not checked: iter_0000010/mp_rank_00/distrib_optim.pt "
            "iter_0000010/mp_rank_01/ iter_0000005/") in out, out
    # Only one rank is read: a fix of the folder would leave the other; refused, nothing written.
    listing = os.path.join(d, "keys.txt")
    run("check-keys", root, want=0)
    with open(listing, "w") as f:
        f.write("language_model.embedding.word_embeddings.weight\n" + "".join(
            "language_model.encoder." + k + "\n" for k in state if k.startswith("block.")) +
            "language_model.output_layer.weight\n")
    wrapped = megatron_state(state)
    wrapped["language_model"]["encoder"] = prefixed(wrapped["language_model"]["encoder"], "module.")
    rank0 = os.path.join(root, "iter_0000010", "mp_rank_00", "model_optim_rng.pt")
    torch.save({"iteration": 10, "model": wrapped}, rank0)
    before = open(rank0, "rb").read()
    out = run("check-keys", root, "--keys", listing, "--in-place", want=3)
    assert "nothing written: the first of 2 ranks was read" in out, out
    assert open(rank0, "rb").read() == before
    run("check-keys", rank0, "--keys", listing, "--in-place", want=1)
    run("check-keys", rank0, "--keys", listing, want=0)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("12")
    out = run("check-keys", root, want=2)
    assert "names iteration 12, whose folder iter_0000012 is missing" in out, out


def dcp_keys(folder):
    return dcp_standin.load(folder)


def case_distributed_checkpoint_sharded_by_fsdp_is_checked_and_fixed(d):
    """FSDP's SHARDED_STATE_DICT saved with torch.distributed.checkpoint by two ranks, as
    {"model": ..., "optim": ...}; the model's keys carry torch.compile's and FSDP's components."""
    model, _ = trained()
    clean = model.state_dict()
    wrapped = prefixed(clean, "_orig_mod._fsdp_wrapped_module.")
    src = os.path.join(d, "step_500")
    dcp_standin.save({"model": wrapped, "optim": {"step": torch.tensor(3.0)}}, src, ranks=2)
    out = run("check-keys", src, want=1)
    assert "torch.distributed.checkpoint, state dict in entry 'model', .metadata and 2 .distcp " \
        "files, 7 keys" in out, out
    assert "other entries, not checked: optim" in out, out
    assert "_orig_mod._fsdp_wrapped_module.embed.weight  (component 0: _orig_mod)" in out, out
    ref = save_clean(d, model)
    fixed = os.path.join(d, "fixed")
    os.mkdir(fixed)
    out = run("check-keys", src, "--against", ref, "--fix", fixed, want=1)
    assert f"wrote {fixed}/.metadata" in out, out
    back = dcp_keys(fixed)
    assert sorted(back) == sorted(["model." + k for k in clean] + ["optim.step"]), sorted(back)
    for k, v in clean.items():
        assert torch.equal(back["model." + k], v), k
    for name in os.listdir(src):  # every .distcp byte kept
        if name.endswith(".distcp"):
            assert open(os.path.join(src, name), "rb").read() == \
                open(os.path.join(fixed, name), "rb").read(), name
    run("check-keys", fixed, "--against", ref, want=0)
    # The folder written holds a checkpoint now: a second fix into it is refused, nothing lost.
    out = run("check-keys", src, "--against", ref, "--fix", fixed, want=73)
    assert "exists" in out, out
    # In place: only .metadata is replaced.
    before = {n: open(os.path.join(src, n), "rb").read() for n in os.listdir(src)}
    run("check-keys", src, "--against", ref, "--in-place", want=1)
    for name, data in before.items():
        if name != ".metadata":
            assert open(os.path.join(src, name), "rb").read() == data, name
    run("check-keys", os.path.join(src, ".metadata"), "--against", ref, want=0)
    same(dict(sorted(dcp_keys(src).items())), dict(sorted(back.items())))


def case_distributed_checkpoint_flat_from_one_process(d):
    model, _ = trained()
    src = os.path.join(d, "ckpt")
    dcp_standin.save(prefixed(model.state_dict(), "module."), src, ranks=1)
    ref = save_clean(d, model)
    out = run("check-keys", src, "--against", ref, "--in-place", want=1)
    assert "module.embed.weight -> embed.weight" in out, out
    same(dict(sorted(dcp_keys(src).items())), dict(sorted(model.state_dict().items())))
    # The 2.1/2.2 layout (TensorProperties from torch.distributed._shard) reads the same.
    old = os.path.join(d, "old")
    dcp_standin.save(model.state_dict(), old, ranks=3, legacy_properties=True)
    run("check-keys", old, "--against", ref, want=0)


def case_damaged_distributed_checkpoints_are_named_and_left_alone(d):
    model, _ = trained()
    ref = save_clean(d, model)
    src = os.path.join(d, "ckpt")
    dcp_standin.save(prefixed(model.state_dict(), "module."), src, ranks=2)
    meta = os.path.join(src, ".metadata")
    whole = open(meta, "rb").read()
    with open(meta, "wb") as f:
        f.write(whole[:len(whole) // 2])
    out = run("check-keys", src, "--against", ref, "--in-place", want=2)
    assert ".metadata" in out and "at byte" in out, out
    assert open(meta, "rb").read() == whole[:len(whole) // 2], "a damaged .metadata was written"
    with open(meta, "wb") as f:
        f.write(whole)
    distcp = os.path.join(src, "__1_0.distcp")
    data = open(distcp, "rb").read()
    with open(distcp, "wb") as f:
        f.write(data[:-10])
    out = run("check-keys", src, "--against", ref, "--in-place", want=2)
    assert "__1_0.distcp" in out and "shorter than the .metadata says" in out, out
    assert open(meta, "rb").read() == whole
    os.unlink(distcp)
    out = run("check-keys", src, want=2)
    assert "__1_0.distcp" in out and "missing" in out, out
    # A .metadata naming what DCP never writes is refused by name, nothing of it run.
    with open(meta, "wb") as f:
        f.write(b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x8c\x04true\x94\x85R.")
    out = run("check-keys", src, want=2)
    assert "names 'os system'" in out, out
    os.unlink(meta)
    out = run("check-keys", src, want=2)
    assert "without its .metadata" in out, out
    out = run("check-keys", os.path.join(src, "__0_0.distcp"), want=3)
    assert "name the folder" in out, out


def nemo_archive(d, state, name, gz=False, ranks=0):
    """A .nemo as NeMo's SaveRestoreConnector writes it: its model_config.yaml, the weights
    (torch.save of the state dict) as model_weights.ckpt, one per rank under mp_rank_NN/ with
    model parallelism, and tokenizer files, tarred from a folder as "." ("w:"; NeMo before 1.7
    gzipped it, "w:gz")."""
    src = os.path.join(d, name + ".src")
    os.makedirs(src)
    with open(os.path.join(src, "model_config.yaml"), "w") as f:
        f.write("target: nemo.collections.nlp.models.TinyModel\ntokenizer:\n  model: a.model\n")
    with open(os.path.join(src, "3f2a_tokenizer.model"), "wb") as f:
        f.write(bytes(range(256)) * 3)
    if ranks:
        for r in range(ranks):
            os.makedirs(os.path.join(src, f"mp_rank_{r:02d}"))
            torch.save(state, os.path.join(src, f"mp_rank_{r:02d}", "model_weights.ckpt"))
    else:
        torch.save(state, os.path.join(src, "model_weights.ckpt"))
    path = os.path.join(d, name)
    with tarfile.open(path, "w:gz" if gz else "w:") as tar:
        tar.add(src, arcname=".")
    shutil.rmtree(src)
    return path


def nemo_members(path):
    """Every member of the archive: name -> (type, data), as tarfile reads them."""
    with tarfile.open(path, "r:*") as tar:
        return {m.name: (m.type, tar.extractfile(m).read() if m.isfile() else None)
                for m in tar.getmembers()}


def nemo_weights(path, member="./model_weights.ckpt"):
    """The weights as NeMo restores them: the member extracted, then torch.load."""
    with tarfile.open(path, "r:*") as tar:
        return torch.load(io.BytesIO(tar.extractfile(member).read()))


def case_nemo_archives_are_read_and_fixed_with_every_member_kept(d):
    model, _ = trained()
    clean = model.state_dict()
    ref = save_clean(d, model)
    for gz in (False, True):
        path = nemo_archive(d, prefixed(clean, "_orig_mod."), f"m{int(gz)}.nemo", gz)
        out = run("check-keys", path, "--against", ref, want=1)
        assert "member ./model_weights.ckpt of the archive" in out, out
        assert "not checked: 3f2a_tokenizer.model model_config.yaml" in out, out
        assert "_orig_mod.embed.weight -> embed.weight" in out, out
        fixed = os.path.join(d, f"fixed{int(gz)}.nemo")
        out = run("check-keys", path, "--against", ref, "--fix", fixed, want=1)
        assert "kept every other member of the archive as it was (2)" in out, out
        same(nemo_weights(fixed), clean)
        before, after = nemo_members(path), nemo_members(fixed)
        assert list(before) == list(after), (list(before), list(after))
        for name, (kind, data) in before.items():
            if name != "./model_weights.ckpt":
                assert after[name] == (kind, data), name
        with open(fixed, "rb") as f:
            assert (f.read(2) == b"\x1f\x8b") == gz, "compression changed"
        run("check-keys", fixed, "--against", ref, want=0)
        plain = os.path.join(d, f"weights{int(gz)}.pt")
        out = run("check-keys", path, "--against", ref, "--fix", plain, want=1)
        assert "stay in " + path in out, out
        same(torch.load(plain), clean)
        run("check-keys", path, "--against", ref, "--in-place", want=1)
        same(nemo_weights(path), clean)
        assert not [n for n in os.listdir(d) if "wrapcert" in n], os.listdir(d)
    # Model parallel: one file per rank; a fix of the first alone is refused.
    path = nemo_archive(d, prefixed(clean, "module."), "tp.nemo", ranks=2)
    whole = open(path, "rb").read()
    out = run("check-keys", path, "--against", ref, want=1)
    assert "member ./mp_rank_00/model_weights.ckpt" in out, out
    assert "mp_rank_01/model_weights.ckpt" in out, out
    out = run("check-keys", path, "--against", ref, "--in-place", want=3)
    assert "the first of 2 ranks" in out and "nothing written" in out, out
    assert open(path, "rb").read() == whole
    # A .nemo name is written only as the fix of an archive.
    out = run("check-keys", ref, "--against", ref, "--fix", os.path.join(d, "x.nemo"), want=73)
    assert "only as the fix of one" in out, out


def tar_with(path, members, mode="w:"):
    """A tar of `members`: (name, bytes) for files, (name, "->target") for symbolic links."""
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def case_damaged_and_hostile_archives_are_named_and_left_alone(d):
    model, _ = trained()
    ref = save_clean(d, model)
    buf = io.BytesIO()
    torch.save(prefixed(model.state_dict(), "module."), buf)
    weights = buf.getvalue()
    cases = [
        ("outside.nemo", [("./model_weights.ckpt", weights), ("../escape.txt", b"x")],
         "'../escape.txt'", "outside the archive's folder"),
        ("absolute.nemo", [("/etc/cron.d/x", b"x"), ("./model_weights.ckpt", weights)],
         "'/etc/cron.d/x'", "outside the archive's folder"),
        ("link.nemo", [("./model_weights.ckpt", weights), ("./cfg", "->../../etc/passwd")],
         "'./cfg'", "leads outside"),
        ("twice.nemo", [("./model_weights.ckpt", weights), ("model_weights.ckpt", weights)],
         "model_weights.ckpt", "stored twice"),
    ]
    for name, members, who, what in cases:
        path = os.path.join(d, name)
        tar_with(path, members)
        whole = open(path, "rb").read()
        out = run("check-keys", path, "--against", ref, "--in-place", want=2)
        assert who in out and what in out and "byte" in out, out
        assert open(path, "rb").read() == whole
    for mode, name in (("w:", "cut.nemo"), ("w:gz", "cut.tar.gz")):
        path = os.path.join(d, name)
        tar_with(path, [("./model_config.yaml", b"a: 1\n"), ("./model_weights.ckpt", weights)],
                 mode)
        with open(path, "rb") as f:
            whole = f.read()
        # Cut inside the weights (their header at byte 1024 of the tar stream); gzipped, inside
        # the compressed stream.
        cut = whole[:1536 + len(weights) // 2] if mode == "w:" else whole[:len(whole) // 2]
        with open(path, "wb") as f:
            f.write(cut)
        out = run("check-keys", path, "--against", ref, "--in-place", want=2)
        assert "damaged" in out and path in out, out
        assert open(path, "rb").read() == cut
    path = os.path.join(d, "config-only.nemo")
    tar_with(path, [("./model_config.yaml", b"a: 1\n")])
    out = run("check-keys", path, want=3)
    assert "no model_weights.ckpt" in out and "model_config.yaml" in out, out
    # Weights that are damaged inside the archive are named as its member.
    path = os.path.join(d, "bad-weights.nemo")
    tar_with(path, [("./model_weights.ckpt", weights[:100])])
    out = run("check-keys", path, want=2)
    assert path + " (member ./model_weights.ckpt)" in out and "/proc/self" not in out, out


def diffusers_pipeline(d, name, unet, text_encoder, vae):
    """A pipeline folder as diffusers' save_pretrained writes it: model_index.json naming each
    component, a folder per component (weights in safetensors, or transformers' .bin for the
    text encoder), the scheduler and tokenizer folders with no weights."""
    root = os.path.join(d, name)
    index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.21.0",
             "feature_extractor": [None, None], "safety_checker": [None, None],
             "scheduler": ["diffusers", "PNDMScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"],
             "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}
    for sub in ("scheduler", "text_encoder", "tokenizer", "unet", "vae"):
        os.makedirs(os.path.join(root, sub))
    with open(os.path.join(root, "model_index.json"), "w") as f:
        json.dump(index, f)
    for sub, files in {"scheduler": ["scheduler_config.json"], "tokenizer": ["vocab.json"],
                       "unet": ["config.json"], "vae": ["config.json"],
                       "text_encoder": ["config.json"]}.items():
        for file in files:
            with open(os.path.join(root, sub, file), "w") as f:
                f.write("{}")
    write_safetensors(os.path.join(root, "unet", "diffusion_pytorch_model.safetensors"), unet,
                      {"format": "pt"})
    write_safetensors(os.path.join(root, "vae", "diffusion_pytorch_model.safetensors"), vae,
                      {"format": "pt"})
    torch.save(text_encoder, os.path.join(root, "text_encoder", "pytorch_model.bin"))
    return root


def case_diffusers_pipeline_checks_each_component(d):
    model, _ = trained()
    clean = model.state_dict()
    vae = collections.OrderedDict((k, v * 2) for k, v in clean.items() if "block" in k)
    ref = diffusers_pipeline(d, "ref", clean, clean, vae)
    # A training script that saved its torch.compile'd UNet and its DDP-wrapped text encoder.
    pipe = diffusers_pipeline(d, "pipe", prefixed(clean, "_orig_mod."), prefixed(clean, "module."),
                              vae)
    # diffusers' fp16 variant beside the UNet's weights, wrapped the same way.
    half = collections.OrderedDict((k, v.half() if v.is_floating_point() else v)
                                   for k, v in prefixed(clean, "_orig_mod.").items())
    variant = os.path.join(pipe, "unet", "diffusion_pytorch_model.fp16.safetensors")
    write_safetensors(variant, half, {"format": "pt"})
    out = run("check-keys", pipe, want=1)
    assert "diffusers pipeline: " + pipe + " (3 models with weights: text_encoder unet vae)" in out
    assert "not checked: model_index.json scheduler/ tokenizer/" in out, out
    assert "component unet:" in out and "component vae:" in out, out
    assert "variants of the weights, each a checkpoint of its own: " \
        "diffusion_pytorch_model.fp16.safetensors" in out, out
    assert "variant " + variant + ":" in out, out
    out = run("check-keys", pipe, "--against", ref, want=1)
    assert "module.embed.weight -> embed.weight" in out, out
    assert "_orig_mod.embed.weight -> embed.weight" in out, out
    assert "compared by names and shapes: a variant keeps a dtype of its own" in out, out
    out = run("check-keys", pipe, "--fixture", "gemma-2b", want=64)
    assert "check one component by its folder" in out, out
    out = run("check-keys", pipe, "--against", ref, "--fix", os.path.join(d, "out"), want=64)
    assert "--in-place" in out, out
    out = run("check-keys", pipe, "--against", os.path.join(ref, "unet"), want=64)
    assert "against another pipeline" in out, out
    vae_before = open(os.path.join(pipe, "vae", "diffusion_pytorch_model.safetensors"), "rb").read()
    run("check-keys", pipe, "--against", ref, "--in-place", want=1)
    run("check-keys", pipe, "--against", ref, want=0)
    unet, _ = read_safetensors_plain(os.path.join(pipe, "unet", "diffusion_pytorch_model.safetensors"))
    same(dict(unet), dict(clean))
    unet16, _ = read_safetensors_plain(variant)
    same(dict(unet16), {k[len("_orig_mod."):]: v for k, v in half.items()})
    same(torch.load(os.path.join(pipe, "text_encoder", "pytorch_model.bin")), clean)
    assert open(os.path.join(pipe, "vae", "diffusion_pytorch_model.safetensors"), "rb").read() \
        == vae_before
    # A component the reference has and the pipeline lacks, and one the index names but that
    # is not there.
    shutil.rmtree(os.path.join(ref, "vae"))
    shutil.copytree(os.path.join(pipe, "vae"), os.path.join(ref, "vae"))
    with open(os.path.join(pipe, "model_index.json")) as f:
        index = json.load(f)
    del index["vae"]
    with open(os.path.join(pipe, "model_index.json"), "w") as f:
        json.dump(index, f)
    out = run("check-keys", pipe, "--against", ref, want=2)
    assert "component vae: missing" in out, out
    index["vae"] = ["diffusers", "AutoencoderKL"]
    shutil.rmtree(os.path.join(pipe, "vae"))
    with open(os.path.join(pipe, "model_index.json"), "w") as f:
        json.dump(index, f)
    out = run("check-keys", pipe, want=2)
    assert "'vae'" in out and "no folder" in out, out


def killed_at_random(d, args, check, times=12):
    """Runs wrapcert with `args` and kills it (SIGKILL) at random moments over its run time;
    after each, `check()` must find the old or the new checkpoint, whole."""
    import random
    import subprocess
    import time
    rng = random.Random(7)
    start = time.monotonic()
    subprocess.run([*COMMAND, *args], capture_output=True, timeout=120)
    took = time.monotonic() - start
    for _ in range(times):
        proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, took))
        proc.kill()
        proc.wait()
        check()
    leftovers = [n for n in os.listdir(d) if "wrapcert" in n or n.startswith(".tmp")]
    assert not leftovers, leftovers


def case_in_place_killed_at_random_leaves_a_checkpoint_that_loads(d):
    model, _ = trained()
    clean = model.state_dict()
    ref = save_clean(d, model)
    src = os.path.join(d, "dcp")
    dcp_standin.save(prefixed(clean, "module."), src, ranks=2)
    old_keys = sorted(dcp_keys(src))

    def dcp_whole():
        got = dcp_keys(src)
        assert sorted(got) in (old_keys, sorted(clean)), sorted(got)

    def restore_dcp():
        dcp_standin.save(prefixed(clean, "module."), src + ".again", ranks=2)
        os.replace(os.path.join(src + ".again", ".metadata"), os.path.join(src, ".metadata"))
        shutil.rmtree(src + ".again")

    for _ in range(2):
        killed_at_random(src, ["check-keys", src, "--against", ref, "--in-place"], dcp_whole, 6)
        restore_dcp()
    ema = os.path.join(d, "last.pth")
    saved = {"state_dict": prefixed(clean, "module."), "state_dict_ema": prefixed(clean, "module.")}
    torch.save(saved, ema)

    def ema_whole():
        got = torch.load(ema)
        assert list(got["state_dict"]) == list(got["state_dict_ema"]), "half renamed"
        assert list(got["state_dict"]) in (list(saved["state_dict"]), list(clean)), got.keys()

    killed_at_random(d, ["check-keys", ema, "--against", ref, "--in-place"], ema_whole)
    nemo = nemo_archive(d, prefixed(clean, "module."), "model.nemo", gz=True)
    old_nemo = list(prefixed(clean, "module."))

    def nemo_whole():
        assert list(nemo_weights(nemo)) in (old_nemo, list(clean))
        assert len(nemo_members(nemo)) == 4

    killed_at_random(d, ["check-keys", nemo, "--against", ref, "--in-place"], nemo_whole, 8)
    # A pipeline is fixed component by component, each atomically: every component loads,
    # with its old keys or its new ones.
    vae = collections.OrderedDict((k, v) for k, v in clean.items() if "block" in k)
    reference = diffusers_pipeline(d, "reference", clean, clean, vae)
    pipe = diffusers_pipeline(d, "pipe", prefixed(clean, "_orig_mod."), prefixed(clean, "module."),
                              prefixed(vae, "module."))

    def pipeline_whole():
        unet, _ = read_safetensors_plain(
            os.path.join(pipe, "unet", "diffusion_pytorch_model.safetensors"))
        assert sorted(unet) in (sorted(prefixed(clean, "_orig_mod.")), sorted(clean))
        text = torch.load(os.path.join(pipe, "text_encoder", "pytorch_model.bin"))
        assert list(text) in (list(prefixed(clean, "module.")), list(clean))
        v, _ = read_safetensors_plain(
            os.path.join(pipe, "vae", "diffusion_pytorch_model.safetensors"))
        assert sorted(v) in (sorted(prefixed(vae, "module.")), sorted(vae))

    killed_at_random(os.path.join(pipe, "unet"),
                     ["check-keys", pipe, "--against", reference, "--in-place"], pipeline_whole, 6)
    for sub in ("text_encoder", "vae"):
        assert not [n for n in os.listdir(os.path.join(pipe, sub)) if "wrapcert" in n]


CASES = [(name, fn) for name, fn in sorted(globals().items()) if name.startswith("case_")]


def main():
    return test_check_keys_training.main(CASES, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
