#!/usr/bin/env python3
"""Dump a real PyTorch module tree, wrapped by PyTorch's own wrappers, to JSON for wrapcert:
class names, children in order, parameters and buffers (shape, dtype, storage id), the wrapped
state-dict keys, the model's own keys before wrapping, and which classes are wrappers.
Needs only Debian's python3-torch.

    /usr/bin/python3 tools/torch_tree_dump.py CASE --out dump.json
    CASE: data_parallel | ddp | checkpoint | data_parallel_over_checkpoint | user_module
    /usr/bin/python3 tools/torch_tree_dump.py --model mypkg.models:build [--wrap DataParallel] \
        --out dump.json

With --model, `build()` (found through PYTHONPATH) makes your own model; each --wrap wraps its
root in turn (DataParallel, DistributedDataParallel or checkpoint_wrapper). Check the dump with
`wrapcert check-dump dump.json`.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.nn as nn

# Python class -> wrapcert kind (the kind must use the same child slot).
WRAPPERS = {"DataParallel": "DataParallel", "DistributedDataParallel": "DistributedDataParallel",
            "CheckpointWrapper": "CheckpointWrapper"}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return x + self.norm(self.proj(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class NormWithModule(nn.Module):
    """A user module that keeps a child named `module` beside its own weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.module = nn.Linear(4, 4)


def checkpointed(model):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    for i, layer in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(layer)
    return model


def build(case):
    torch.manual_seed(0)
    if case == "user_module":
        model = nn.Sequential(nn.Linear(4, 4), NormWithModule())
        return model, list(model.state_dict().keys()), model
    model = Net()
    clean = list(model.state_dict().keys())
    if case == "data_parallel":
        return model, clean, nn.DataParallel(model)
    if case == "checkpoint":
        return model, clean, checkpointed(model)
    if case == "data_parallel_over_checkpoint":
        return model, clean, nn.DataParallel(checkpointed(model))
    if case == "ddp":
        import torch.distributed as dist
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        return model, clean, nn.parallel.DistributedDataParallel(model)
    raise SystemExit("unknown case " + case)


def wrap_root(model, name):
    if name == "DataParallel":
        return nn.DataParallel(model)
    if name == "DistributedDataParallel":
        import torch.distributed as dist
        if not dist.is_initialized():
            store = os.path.join(tempfile.mkdtemp(), "store")
            dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        return nn.parallel.DistributedDataParallel(model)
    if name == "checkpoint_wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        return checkpoint_wrapper(model)
    raise SystemExit("--wrap: unknown wrapper " + name)


def user_model(path, wraps):
    import importlib
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise SystemExit("--model wants package.module:factory, not " + path)
    torch.manual_seed(0)
    model = getattr(importlib.import_module(module_name), attr)()
    clean = list(model.state_dict().keys())
    wrapped = model
    for name in wraps:
        wrapped = wrap_root(wrapped, name)
    return model, clean, wrapped


def dump(root):
    nodes, index, storages = [], {}, {}

    def storage_id(t):
        key = t.storage().data_ptr()
        return storages.setdefault(key, len(storages))

    def visit(m):
        if id(m) in index:
            return index[id(m)]
        index[id(m)] = len(nodes)
        node = {"class": type(m).__name__, "children": [], "params": [], "buffers": []}
        nodes.append(node)
        for name, p in m._parameters.items():
            if p is not None:
                node["params"].append([name, list(p.shape), str(p.dtype)[6:], storage_id(p)])
        for name, b in m._buffers.items():
            if b is not None and name not in getattr(m, "_non_persistent_buffers_set", set()):
                node["buffers"].append([name, list(b.shape), str(b.dtype)[6:], storage_id(b)])
        for name, child in m._modules.items():
            if child is not None:
                node["children"].append([name, visit(child)])
        return index[id(m)]

    root_index = visit(root)
    return root_index, nodes


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", nargs="?")
    parser.add_argument("--model", help="package.module:factory making your own model")
    parser.add_argument("--wrap", action="append", default=[],
                        help="wrap the root of --model's model (repeatable)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if (args.case is None) == (args.model is None):
        parser.error("give a CASE or --model")
    if args.model:
        model, clean, wrapped = user_model(args.model, args.wrap)
        args.case = args.model
    else:
        model, clean, wrapped = build(args.case)
    root, nodes = dump(wrapped)
    with open(args.out, "w") as f:
        json.dump({"case": args.case, "torch_version": torch.__version__, "wrappers": WRAPPERS,
                   "root": root, "nodes": nodes, "clean_keys": clean,
                   "wrapped_keys": list(wrapped.state_dict().keys())}, f, indent=1)


if __name__ == "__main__":
    main()
