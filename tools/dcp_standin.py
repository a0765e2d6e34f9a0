"""A stand-in for PyTorch 2.x's torch.distributed.checkpoint (DCP) on-disk format.

It writes and reads checkpoint folders laid out exactly as DCP's ``save``/``save_state_dict``
with ``FileSystemWriter`` (single_file_per_rank=True, thread_count=1) and the
``DefaultSavePlanner`` (flatten_state_dict=True) of PyTorch 2.1-2.3 lay them out, for machines
whose PyTorch lacks torch.distributed.checkpoint (it came in 2.0; Debian's 1.13 has none):

  .metadata           pickle.dump(Metadata, f) at protocol 4 (Python 3.8-3.13's default) of
                      Metadata(state_dict_metadata, planner_data, storage_data):
                        state_dict_metadata  {fqn: TensorStorageMetadata(properties, size, chunks)
                                              | BytesStorageMetadata()}, chunks being
                                              [ChunkStorageMetadata(offsets, sizes)] (torch.Size)
                        planner_data         {fqn: path tuple in the nested state dict}
                        storage_data         {MetadataIndex(fqn, offset, index): _StorageInfo(
                                              relative_path, offset, length)}
  __{rank}_0.distcp   one file per rank (written even if empty), its items back to back with
                      no padding: first the rank's bytes items, raw bytes of
                      ``torch.save(obj, io.BytesIO())``; then its tensor items in plan order, each
                      ``torch.save(tensor, stream)`` appended at the stream's position (a
                      complete torch zip archive of its own).  _StorageInfo.offset/length give
                      each item's byte range.

Pickled globals are the real ones: if torch.distributed.checkpoint imports, its classes are used;
otherwise stand-in classes with the real __module__/__qualname__ are registered in sys.modules
under ``torch.distributed.checkpoint.metadata`` and ``torch.distributed.checkpoint.filesystem``
(and ``torch.distributed._shard.sharded_tensor.metadata`` when that one fails to import, as it
does for torch 1.13 under Python 3.11), but not the package torch.distributed.checkpoint
itself, so ``import torch.distributed.checkpoint`` still fails as before.

TensorProperties: 2.3 pickles torch.distributed.checkpoint.metadata.TensorProperties (state: the
tuple (dtype, layout, requires_grad, _MEM_FORMAT_ENCODING member, pin_memory)); 2.1 and 2.2
pickled torch.distributed._shard.sharded_tensor.metadata.TensorProperties with the same tuple
but that module's MEM_FORMAT_ENCODING.  ``save(..., legacy_properties=True)`` writes the latter;
``load`` reads both.

Known differences from the real thing:
  * tensor blobs are the local torch's torch.save output: a valid torch zip archive that torch
    2.x loads, but torch 2.x's own torch.save adds small records (``byteorder``,
    ``.data/serialization_id``), so blob bytes and lengths differ slightly;
  * ranks > 1 simulates FSDP SHARDED_STATE_DICT in one process: every tensor with rows is
    split along dim 0 with ``tensor.chunk(ranks)`` (as FSDP shards parameters); 0-d and 0-row
    tensors and non-tensors go whole to rank 0 (real FSDP keeps buffers replicated and lets
    DCP's dedup pick a rank, which need not be rank 0).  Plans and write results are pickled
    and unpickled, as torch.distributed's gather/scatter_object do, so the memo sharing of
    fqn strings in .metadata matches a multi-process run;
  * the stand-in enum pickles by value, ``(cls, (value,))``, as on Python 3.8-3.10 and 3.11.5+
    (Python 3.11.0-3.11.4 wrote ``getattr(cls, name)``);
  * on a CUDA machine real DCP's overlapping loader writes a file's tensors smallest first;
    here (as real DCP on a CPU-only machine) they go in state-dict order.
"""
import collections
import dataclasses
import enum
import io
import os
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

__all__ = ["save", "load", "read_metadata", "DCPFormatError", "USING_REAL_DCP"]

_MD = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
_SHARD_MD = "torch.distributed._shard.sharded_tensor.metadata"


class DCPFormatError(RuntimeError):
    """A checkpoint folder that does not hold what its .metadata promises."""


def _props_class(enum_name):
    """TensorProperties as PyTorch 2.x defines it (twice: in DCP's metadata and in _shard's)."""

    class MemFormat(enum.Enum):
        TORCH_CONTIGUOUS_FORMAT = 0
        TORCH_CHANNELS_LAST = 1
        TORCH_PRESERVE_FORMAT = 2

        def __reduce_ex__(self, proto):  # by value on every Python (see module docstring)
            return self.__class__, (self._value_,)

    formats = [torch.contiguous_format, torch.channels_last, torch.preserve_format]

    @dataclass
    class TensorProperties:
        dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
        layout: torch.layout = field(default=torch.strided)
        requires_grad: bool = False
        memory_format: torch.memory_format = field(default=torch.contiguous_format)
        pin_memory: bool = False

        def __getstate__(self):  # torch.memory_format cannot be pickled: encode it
            code = MemFormat(formats.index(self.memory_format))
            return (self.dtype, self.layout, self.requires_grad, code, self.pin_memory)

        def __setstate__(self, state):
            self.dtype, self.layout, self.requires_grad, code, self.pin_memory = state
            self.memory_format = formats[MemFormat(code).value]

        @staticmethod
        def create_from_tensor(tensor):
            return TensorProperties(dtype=tensor.dtype, layout=tensor.layout,
                                    requires_grad=tensor.requires_grad,
                                    memory_format=torch.contiguous_format,
                                    pin_memory=tensor.is_pinned())

    MemFormat.__name__ = MemFormat.__qualname__ = enum_name
    return TensorProperties, MemFormat


def _standin_metadata_classes():
    @dataclass
    class ChunkStorageMetadata:
        offsets: torch.Size
        sizes: torch.Size

    TensorProperties, MemFormat = _props_class("_MEM_FORMAT_ENCODING")

    @dataclass
    class TensorStorageMetadata:
        properties: Any
        size: torch.Size
        chunks: list

    @dataclass
    class BytesStorageMetadata:
        pass

    @dataclass
    class Metadata:
        state_dict_metadata: dict
        planner_data: Any = None
        storage_data: Any = None

    @dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        offset: Optional[torch.Size] = None
        index: Optional[int] = field(hash=False, compare=False, default=None)

        def __init__(self, fqn: str, offset: Optional[Sequence[int]] = None,
                     index: Optional[int] = None):
            # Same assignment order as the real one: it fixes the pickled __dict__'s key order
            # (and "offset" is absent from __dict__ when None).
            object.__setattr__(self, "fqn", fqn)
            object.__setattr__(self, "index", index)
            if offset is not None:
                object.__setattr__(self, "offset", torch.Size(offset))

    return dict(ChunkStorageMetadata=ChunkStorageMetadata, TensorProperties=TensorProperties,
                _MEM_FORMAT_ENCODING=MemFormat, TensorStorageMetadata=TensorStorageMetadata,
                BytesStorageMetadata=BytesStorageMetadata, Metadata=Metadata,
                MetadataIndex=MetadataIndex)


def _register(name, classes):
    """A module named ``name`` in sys.modules holding ``classes`` under their real paths."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "_DCP_STANDIN", False):
        return mod  # this file was imported twice: keep the first classes
    mod = types.ModuleType(name, "dcp_standin's stand-in for PyTorch 2.x's " + name)
    mod._DCP_STANDIN = True
    for cname, cls in classes.items():
        cls.__module__ = name
        cls.__qualname__ = cname
        setattr(mod, cname, cls)
    sys.modules[name] = mod
    return mod


try:  # the real one where this torch has it
    import torch.distributed.checkpoint.filesystem as _fs
    import torch.distributed.checkpoint.metadata as _md
    USING_REAL_DCP = True
except Exception:
    USING_REAL_DCP = False
    _md = _register(_MD, _standin_metadata_classes())

    @dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int

    _fs = _register(_FS, {"_StorageInfo": _StorageInfo})

try:  # 2.1/2.2's TensorProperties, for legacy_properties=True and for reading 2.1/2.2 folders
    import importlib
    _shard_md = importlib.import_module(_SHARD_MD)
except Exception:
    _P, _E = _props_class("MEM_FORMAT_ENCODING")
    _shard_md = _register(_SHARD_MD, {"TensorProperties": _P, "MEM_FORMAT_ENCODING": _E})

MetadataIndex = _md.MetadataIndex
Metadata = _md.Metadata
_StorageInfo = _fs._StorageInfo

# ------------------------------------------------------------------------------------ save

_TENSOR, _SHARD, _BYTES = "tensor", "shard", "bytes"


def _flatten_state_dict(state_dict):
    """DCP 2.1-2.3's flatten_state_dict over traverse_state_dict (now traverse_state_dict_v_2_3):
    mappings are walked into unless they and all that they hold contain no tensor (then the
    whole mapping is one bytes item); lists only when they hold tensors or such mappings."""

    def is_terminal(value):
        if isinstance(value, collections.abc.Mapping):
            values = value.values()
        elif isinstance(value, list):
            values = value
        else:
            return True
        for entry in values:
            if isinstance(entry, (collections.abc.Mapping, list)) and not is_terminal(entry):
                return False
            if isinstance(entry, torch.Tensor):
                return False
        return True

    flattened, mappings = {}, {}

    def visit(path, value):
        if is_terminal(value):
            new_fqn = ".".join(map(str, path))
            if new_fqn in flattened:
                raise ValueError(f"duplicated flatten key {new_fqn}")
            flattened[new_fqn] = value
            mappings[new_fqn] = path
        elif isinstance(value, collections.abc.Mapping):
            for k, v in value.items():
                visit(path + (str(k),), v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                visit(path + (i,), v)

    for key, value in state_dict.items():
        visit((str(key),), value)
    return flattened, mappings


def _local_plan(flat, rank, ranks, props_cls):
    """What one rank's DefaultSavePlanner plans: items (kind, MetadataIndex, tensor write data)."""
    items = []
    for fqn, obj in flat.items():
        if isinstance(obj, torch.Tensor):
            if ranks > 1 and obj.dim() > 0 and obj.size(0) > 0:  # FSDP: torch.chunk on dim 0
                chunks = obj.detach().chunk(ranks, dim=0)
                if rank >= len(chunks):
                    continue
                local = chunks[rank].clone()
                offsets = [0] * obj.dim()
                offsets[0] = -(-obj.size(0) // ranks) * rank
                offsets = torch.Size(offsets)
                chunk = _md.ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(local.size()))
                items.append((_SHARD, MetadataIndex(fqn, offsets),
                              (chunk, props_cls.create_from_tensor(local), obj.size())))
            elif rank == 0:  # planner_helpers._create_write_item_for_tensor
                offsets = torch.Size([0] * len(obj.size()))
                chunk = _md.ChunkStorageMetadata(offsets=offsets, sizes=obj.size())
                items.append((_TENSOR, MetadataIndex(fqn, offsets),
                              (chunk, props_cls.create_from_tensor(obj), obj.size())))
        elif rank == 0:  # only the coordinator writes non-tensors
            items.append((_BYTES, MetadataIndex(fqn), None))
    return items


def _global_plan(plans):
    """default_planner.create_default_global_save_plan: metadata, plus index hints rewritten
    to each chunk's position in its TensorStorageMetadata.chunks."""
    md, new_plans = {}, []
    for items in plans:
        new_items = []
        for kind, index, tdata in items:
            if kind == _BYTES:
                md[index.fqn] = _md.BytesStorageMetadata()
                new_items.append((kind, index, tdata))
                continue
            chunk, props, size = tdata
            tmd = md.setdefault(index.fqn, _md.TensorStorageMetadata(
                properties=props, size=size, chunks=[]))
            new_items.append((kind, dataclasses.replace(index, index=len(tmd.chunks)), tdata))
            tmd.chunks.append(chunk)
        new_plans.append(new_items)
    return new_plans, md


def _resolve(flat, kind, index, tdata):
    """The object the planner hands the writer (DefaultSavePlanner.resolve_data + loader)."""
    obj = flat[index.fqn]
    if kind == _BYTES:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf
    tensor = obj.detach()
    if kind == _SHARD:  # the rank's local shard: FSDP holds it as a clone of its rows
        chunk = tdata[0]
        tensor = tensor.narrow(0, chunk.offsets[0], chunk.sizes[0]).clone()
    tensor = tensor.cpu()
    if tensor.storage().size() != tensor.numel():  # _SerialCpuLoader: save no excess storage
        tensor = tensor.clone()
    return tensor


def _roundtrip(obj):
    """What torch.distributed's gather_object/scatter_object_list do to an object."""
    return pickle.loads(pickle.dumps(obj))


def save(state_dict, folder, ranks=1, nested=False, legacy_properties=False):
    """Write ``state_dict`` to ``folder`` as DCP's save with FileSystemWriter would.

    state_dict: a (possibly nested) dict of tensors and other picklable objects; flattened as
        DCP's DefaultSavePlanner does (fqns joined with '.', planner_data {fqn: path}).
    ranks: 1 for a single process; N > 1 simulates N ranks each holding a dim-0 shard of every
        tensor (FSDP SHARDED_STATE_DICT), one ``__{rank}_0.distcp`` per rank.
    nested: True wraps the state dict as {"model": state_dict}, a string wraps it under that
        key (as ``dcp.save({"model": model.state_dict()})``); False writes it as given.
    legacy_properties: pickle TensorProperties as PyTorch 2.1/2.2 (the _shard class) instead
        of 2.3's.
    Returns the Metadata written.
    """
    if nested:
        state_dict = {("model" if nested is True else nested): state_dict}
    props_cls = _shard_md.TensorProperties if legacy_properties else _md.TensorProperties
    os.makedirs(folder, exist_ok=True)
    multi = ranks > 1  # a multi-process run pickles plans and results between ranks

    # Each rank flattens and plans; the coordinator gathers the plans.
    flat, mappings = _flatten_state_dict(state_dict)
    plans = [(_local_plan(flat, r, ranks, props_cls), mappings) for r in range(ranks)]
    if multi:
        plans = [_roundtrip(p) for p in plans]
    new_plans, md = _global_plan([items for items, _ in plans])
    # dict(ChainMap(...)) as create_global_plan merges the ranks' planner_data.
    planner_data = dict(collections.ChainMap(*[m for _, m in plans]))
    metadata = Metadata(state_dict_metadata=md, planner_data=planner_data)
    if multi:
        new_plans = [_roundtrip(p) for p in new_plans]

    # Each rank writes its file: bytes items first, then tensors, back to back.
    all_results = []
    for rank, items in enumerate(new_plans):
        file_name = f"__{rank}_0.distcp"
        results = []
        with open(os.path.join(folder, file_name), "wb") as stream:
            ordered = ([it for it in items if it[0] == _BYTES]
                       + [it for it in items if it[0] != _BYTES])
            for kind, index, tdata in ordered:
                data = _resolve(flat, kind, index, tdata)
                offset = stream.tell()
                if kind == _BYTES:
                    stream.write(data.getbuffer())
                else:
                    torch.save(data, stream)
                length = stream.tell() - offset
                results.append((index, _StorageInfo(file_name, offset, length)))
        all_results.append(results)
    if multi:
        all_results = [_roundtrip(r) for r in all_results]

    # The coordinator's FileSystemWriter.finish: storage_data, then .metadata via a rename.
    storage_md = {}
    for results in all_results:
        storage_md.update({index: info for index, info in results})
    metadata.storage_data = storage_md
    tmp = os.path.join(folder, ".metadata.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(metadata, f, protocol=4)
    os.replace(tmp, os.path.join(folder, ".metadata"))
    return metadata

# ------------------------------------------------------------------------------------ load


def read_metadata(folder):
    """The unpickled Metadata of a DCP checkpoint folder."""
    path = os.path.join(folder, ".metadata")
    if not os.path.isfile(path):
        raise DCPFormatError(f"{folder}: no .metadata file")
    with open(path, "rb") as f:
        return pickle.load(f)


def _read_item(folder, fqn, storage_data, index):
    info = storage_data.get(index)
    if info is None:
        raise DCPFormatError(f"{fqn}: storage_data has no entry for {index}")
    path = os.path.join(folder, info.relative_path)
    try:
        with open(path, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
    except OSError as e:
        raise DCPFormatError(f"{fqn}: cannot read {info.relative_path}: {e}") from e
    if len(data) != info.length:
        raise DCPFormatError(
            f"{fqn}: {info.relative_path} is short: wanted bytes [{info.offset}, "
            f"{info.offset + info.length}), the file has {info.offset + len(data)}")
    return torch.load(io.BytesIO(data), map_location="cpu")


def load(folder, unflatten=False):
    """Read every item of a DCP checkpoint folder, as torch.distributed.checkpoint.load with
    FileSystemReader would fill a state dict: a flat {fqn: tensor or unpickled object}, each
    tensor reassembled from its chunks (whose union must cover it). ``unflatten=True`` nests the
    result back along .metadata's planner_data paths."""
    md = read_metadata(folder)
    storage = md.storage_data or {}
    out = {}
    for fqn, smd in md.state_dict_metadata.items():
        if not hasattr(smd, "chunks"):  # BytesStorageMetadata
            out[fqn] = _read_item(folder, fqn, storage, MetadataIndex(fqn))
            continue
        full = torch.empty(smd.size, dtype=smd.properties.dtype)
        covered = torch.zeros(smd.size, dtype=torch.bool)
        for i, chunk in enumerate(smd.chunks):
            piece = _read_item(folder, fqn, storage, MetadataIndex(fqn, chunk.offsets, i))
            if not isinstance(piece, torch.Tensor) or tuple(piece.shape) != tuple(chunk.sizes):
                raise DCPFormatError(f"{fqn}: chunk {i} holds {type(piece).__name__} "
                                     f"{tuple(getattr(piece, 'shape', ()))}, metadata says "
                                     f"{tuple(chunk.sizes)}")
            view, mask = full, covered
            for d, (o, n) in enumerate(zip(chunk.offsets, chunk.sizes)):
                view, mask = view.narrow(d, o, n), mask.narrow(d, o, n)
            view.copy_(piece)
            mask.fill_(True)
        if not bool(covered.all()):
            raise DCPFormatError(f"{fqn}: its chunks do not cover the whole {tuple(smd.size)}")
        out[fqn] = full
    if not unflatten:
        return out
    nested = {}
    for fqn, value in out.items():
        path = (md.planner_data or {}).get(fqn, (fqn,))
        node = nested
        for key, nxt in zip(path[:-1], path[1:]):
            if isinstance(node, list):
                node.extend([None] * (key + 1 - len(node)))
                if node[key] is None:
                    node[key] = [] if isinstance(nxt, int) else {}
                node = node[key]
            else:
                node = node.setdefault(key, [] if isinstance(nxt, int) else {})
        if isinstance(node, list):
            node.extend([None] * (path[-1] + 1 - len(node)))
        node[path[-1]] = value
    return nested
