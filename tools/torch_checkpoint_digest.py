#!/usr/bin/env python3
"""Print one JSON object describing a checkpoint as PyTorch reads it, so a test can compare a file
wrapcert wrote with the original bit for bit. Needs only Debian's python3-torch.

    /usr/bin/python3 tools/torch_checkpoint_digest.py PATH [--entry a.b]

PATH: a torch.save file (zip or legacy format), a .safetensors file (wrapcert's __metadata__
`wrapcert.aliases` (and the older `wrapcert.order`) honoured: an alias is the very same tensor as its
target), or a Hugging Face `*.index.json` (its weight_map and every shard it names).
--entry a.b picks the state dict inside a nested torch.save dict; without it a root that is not
a dict of tensors is searched for `state_dict`, `model`, `module`, `model_state_dict`.

Output: {"format": zip | legacy | safetensors, "entry", "keys": [saved order],
"tensors": {key: {"dtype", "shape", "stride", "storage_offset", "sha256"}},
"ties": [[keys with one storage, offset, shape and strides]],
"shared_storage": [[keys with one storage, any view]]}, plus "index" and "shards" for an index.
sha256 is of the values made contiguous; groups of two or more keys, each sorted, then the list.
A file it cannot read: exit 1, one line on stderr."""
import argparse
import collections
import hashlib
import json
import os
import struct
import sys
import zipfile

import torch

USUAL_ENTRIES = ("state_dict", "model", "module", "model_state_dict")
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
             "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class Unreadable(Exception):
    pass


def is_state_dict(obj):
    return isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values())


def pick_entry(root, entry):
    if entry is not None:
        obj = root
        for part in entry.split("."):
            if not isinstance(obj, dict) or part not in obj:
                raise Unreadable(f"no entry '{entry}' (stopped at '{part}')")
            obj = obj[part]
        if not is_state_dict(obj):
            raise Unreadable(f"entry '{entry}' is not a dict of tensors")
        return entry, obj
    if is_state_dict(root):
        return "", root
    if isinstance(root, dict):
        for name in USUAL_ENTRIES:
            if name in root and is_state_dict(root[name]):
                return name, root[name]
    raise Unreadable("no state dict: the root is not a dict of tensors and has none of the "
                     f"entries {', '.join(USUAL_ENTRIES)}; name one with --entry")


def read_torch(path, entry):
    fmt = "zip" if zipfile.is_zipfile(path) else "legacy"
    root = torch.load(path, map_location="cpu")
    name, sd = pick_entry(root, entry)
    return fmt, name, list(sd.keys()), sd


def read_safetensors(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Unreadable("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise Unreadable(f"header length {n} runs past the end of the {size}-byte file")
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    if not isinstance(header, dict):
        raise Unreadable("the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    stored = {}
    for key, e in header.items():
        try:
            dtype = ST_DTYPES[e["dtype"]]
            shape = [int(d) for d in e["shape"]]
            begin, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise Unreadable(f"tensor '{key}': bad header entry ({err!r})")
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(data) or end - begin != nbytes:
            raise Unreadable(f"tensor '{key}': data offsets [{begin}, {end}) do not fit its "
                             f"{nbytes} bytes in the {len(data)}-byte data section")
        if nbytes == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
        stored[key] = t
    if "wrapcert.order" not in meta:
        order, sd = list(stored), dict(stored)
        # Tied keys stored once: {"alias": ["target", place in the saved order]}.
        tied = sorted((pos, key, target) for key, (target, pos)
                      in json.loads(meta.get("wrapcert.aliases", "{}")).items())
        for pos, key, target in tied:
            if target not in stored or key in sd or pos > len(order):
                raise Unreadable(f"'{key}': a damaged alias of '{target}'")
            order.insert(pos, key)
            sd[key] = stored[target]  # an alias is the very same tensor object
        return order, sd
    order = json.loads(meta["wrapcert.order"])
    aliases = json.loads(meta.get("wrapcert.aliases", "{}"))
    sd = {}
    for key in order:
        target = aliases.get(key, key)
        if target not in stored:
            raise Unreadable(f"'{key}' names '{target}', which the file does not hold")
        if key in sd:
            raise Unreadable(f"'{key}' is listed twice in wrapcert.order")
        sd[key] = stored[target]  # an alias is the very same tensor object
    return order, sd


def read_index(path):
    with open(path) as f:
        weight_map = json.load(f)["weight_map"]
    folder = os.path.dirname(os.path.abspath(path))
    shards, keys, sd = sorted(set(weight_map.values())), [], {}
    for shard in shards:
        shard_path = os.path.join(folder, shard)
        if shard.endswith(".safetensors"):
            shard_keys, tensors = read_safetensors(shard_path)
        else:
            _, _, shard_keys, tensors = read_torch(shard_path, None)
        for k in shard_keys:
            if weight_map.get(k) != shard:
                raise Unreadable(f"shard {shard} holds '{k}', which the index puts in "
                                 f"{weight_map.get(k)}")
            keys.append(k)
            sd[k] = tensors[k]
    missing = sorted(set(weight_map) - set(sd))
    if missing:
        raise Unreadable(f"the index names keys no shard holds: {', '.join(missing[:5])}")
    fmt = "safetensors" if all(s.endswith(".safetensors") for s in shards) else "zip"
    return fmt, shards, keys, sd


def digest(t):
    t = t.detach()
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()


def groups(sd, full_view):
    found = collections.defaultdict(list)
    for k, t in sd.items():
        ptr = t.storage().data_ptr()
        if ptr == 0:
            continue  # an empty storage has no address to share
        ident = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride())) if full_view else ptr
        found[ident].append(k)
    return sorted(sorted(g) for g in found.values() if len(g) > 1)


def describe(path, entry):
    out = {}
    if path.endswith(".index.json"):
        if entry is not None:
            raise Unreadable("--entry applies to torch.save files only")
        out["format"], out["shards"], keys, sd = read_index(path)
        out["index"], out["entry"] = os.path.basename(path), ""
    elif path.endswith(".safetensors"):
        if entry is not None:
            raise Unreadable("--entry applies to torch.save files only")
        keys, sd = read_safetensors(path)
        out["format"], out["entry"] = "safetensors", ""
    else:
        out["format"], out["entry"], keys, sd = read_torch(path, entry)
    out["keys"] = keys
    out["tensors"] = {k: {"dtype": str(sd[k].dtype).replace("torch.", ""),
                          "shape": list(sd[k].shape), "stride": list(sd[k].stride()),
                          "storage_offset": sd[k].storage_offset(), "sha256": digest(sd[k])}
                      for k in keys}
    out["ties"] = groups(sd, True)
    out["shared_storage"] = groups(sd, False)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--entry", help="dotted path of the state dict in a nested dict")
    args = parser.parse_args()
    try:
        result = describe(args.path, args.entry)
    except Exception as e:  # noqa: BLE001 -- any failure to read is one line and exit 1
        text = str(e) if isinstance(e, Unreadable) else f"{type(e).__name__}: {e}"
        message = " ".join(text.split())
        print(f"torch_checkpoint_digest.py: cannot read {args.path}: {message}", file=sys.stderr)
        sys.exit(1)
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
