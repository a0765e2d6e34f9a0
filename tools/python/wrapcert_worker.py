#!/usr/bin/env python3
"""wrapcert's Python worker: builds generated trees as real torch.nn modules, wraps them with
real wrappers, unwraps them with the subject under test and reports what the properties need.
Started once per run by `wrapcert certify-python`; needs only PyTorch and the standard library.

Protocol (docs/python.md): one JSON object per line on stdin, one reply per line on the file
descriptor the worker keeps for replies (its stdout when it started; anything the code under
test prints goes to stderr). Every reply carries the request's "id".
  {"id": 1, "op": "hello"}                      -> {"id": 1, "ok": true, "torch": "1.13.0"}
  {"id": 2, "op": "case", "spec": {...}, "wrappers": {...}, "unwrap": null, "seed": 3,
   "numerics": true}                             -> {"id": 2, "ok": true, "case": {...}}
  {"id": 3, "op": "repro", ...same fields...}    -> {"id": 3, "ok": true, "script": "..."}
  {"id": 4, "op": "fixture", "name": "tiny-gemma", "wrappers": {...}, "unwrap": null}
A case that raises replies {"ok": false, "stage": "build|wrap|unwrap|run", "who": ...,
"error": ..., "traceback": ...}.
"""
import copy
import hashlib
import importlib
import inspect
import json
import keyword
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def read_text(name):
    with open(os.path.join(HERE, name)) as f:
        return f.read()


PRELUDE = read_text("wrapcert_prelude.py")
UNWRAP_PORT = read_text("wrapcert_unwrap.py")
MODELS = {}
exec(compile(PRELUDE, "wrapcert_prelude.py", "exec"), MODELS)
PORT = {}
exec(compile(UNWRAP_PORT, "wrapcert_unwrap.py", "exec"), PORT)
import torch  # noqa: E402  (the prelude set the default dtype)
import torch.nn as nn  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Wrappers and subjects by name


class Failure(Exception):
    def __init__(self, stage, who, error):
        super().__init__(error)
        self.stage, self.who, self.error = stage, who, error
        self.trace = traceback.format_exc()


def world():
    """(rank, world size): this worker's place among the ranks `wrapcert certify-python
    --world-size N` started (torchrun's variables), else (0, 1)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def join_ranks():
    """Joins the other ranks on torch.distributed's gloo, as torchrun's workers do (env://:
    MASTER_ADDR, MASTER_PORT, and the agent's store under TORCHELASTIC_USE_AGENT_STORE). A rank
    that waits longer than WRAPCERT_COLLECTIVE_TIMEOUT seconds for another raises, so that the
    one it waits for is the one named as hung."""
    import datetime
    import torch.distributed as dist
    if world()[1] > 1 and not dist.is_initialized():
        seconds = float(os.environ.get("WRAPCERT_COLLECTIVE_TIMEOUT", "1800"))
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=seconds))


def _ddp_group():
    import tempfile
    import torch.distributed as dist
    if not dist.is_initialized():
        import atexit
        import shutil
        folder = tempfile.mkdtemp(prefix="wrapcert-ddp-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def _ddp(module):
    _ddp_group()
    return nn.parallel.DistributedDataParallel(module)


def _checkpoint(module):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def _checkpoint_reentrant(module):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.REENTRANT)


def _spmd_fsdp(module):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel)
    return SpmdFullyShardedDataParallel(module)


# Built-in names: (callable, the lines a repro script needs, the expression it calls).
BUILTINS = {
    "DataParallel": (nn.DataParallel, ["from torch.nn import DataParallel"], "DataParallel"),
    "DistributedDataParallel": (_ddp, [
        "import os, tempfile",
        "import torch.distributed as dist",
        "if not dist.is_initialized():",
        "    dist.init_process_group('gloo', store=dist.FileStore(os.path.join(tempfile.mkdtemp(), "
        "'store'), 1), rank=0, world_size=1)",
        "from torch.nn.parallel import DistributedDataParallel"], "DistributedDataParallel"),
    "checkpoint_wrapper": (_checkpoint, [
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
        "    CheckpointImpl, checkpoint_wrapper)"],
        "lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT)"),
    "checkpoint_wrapper[reentrant]": (_checkpoint_reentrant, [
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
        "    CheckpointImpl, checkpoint_wrapper)"],
        "lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.REENTRANT)"),
    "SpmdFullyShardedDataParallel": (_spmd_fsdp, [
        "from torch_xla.experimental.spmd_fully_sharded_data_parallel import (",
        "    SpmdFullyShardedDataParallel)"], "SpmdFullyShardedDataParallel"),
}

# Wrapper classes the reference port knows without being told, and their slots.
KNOWN_SLOTS = [
    ("torch.nn", "DataParallel", "module"),
    ("torch.nn.parallel", "DistributedDataParallel", "module"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "CheckpointWrapper",
     "_checkpoint_wrapped_module"),
    ("torch.distributed.fsdp", "FullyShardedDataParallel", "_fsdp_wrapped_module"),
    ("torch._dynamo.eval_frame", "OptimizedModule", "_orig_mod"),
    ("torch_xla.experimental.spmd_fully_sharded_data_parallel", "SpmdFullyShardedDataParallel",
     "_orig_module"),
]


def import_path(path):
    """`pkg.mod:attr.sub` -> the object, importing `pkg.mod` through sys.path."""
    module_name, sep, attrs = path.partition(":")
    if not sep or not module_name or not attrs:
        raise ValueError(f"'{path}' is not an import path of the form package.module:name")
    obj = importlib.import_module(module_name)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def wrapper_callable(name):
    if name in BUILTINS:
        return BUILTINS[name][0]
    return import_path(name)


def known_kinds():
    kinds = {}
    for module_name, cls, slot in KNOWN_SLOTS:
        try:
            kinds[getattr(importlib.import_module(module_name), cls)] = slot
        except Exception:  # not importable here (torch_xla, or an older torch)
            pass
    return kinds


KNOWN_KINDS = known_kinds()

# ---------------------------------------------------------------------------------------------
# Specs as PyTorch code

LEAVES = {
    "Linear": "nn.Linear({d}, {d})",
    "LinearNoBias": "nn.Linear({d}, {d}, bias=False)",
    "Embedding": "nn.Embedding({d}, {d})",
    "LayerNorm": "nn.LayerNorm({d})",
    "RMSNorm": "RMSNorm({d})",
    "Buffered": "ScaleWithBuffer({d})",
    "ModeScale": "ModeScale({d})",
    "TorchLinear": "nn.Linear({d}, {d})",  # LibTorch's own Linear in C++; nn.Linear here
}
TIEABLE = ("Linear", "LinearNoBias", "Embedding", "TorchLinear")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def child_ref(name):
    return "." + name if name.isidentifier() and not keyword.iskeyword(name) else None


class Builder:
    """Turns a spec into the statements that build it, following the C++ builder's rules
    (which nodes are skipped, how names are made unique, which earlier module a shared node or
    a tie picks), so both sides build the same keys from one spec."""

    def __init__(self, spec):
        self.dim = int(spec["dim"])
        self.batch = int(spec.get("batch", 2))
        self.eval = bool(spec.get("eval", False))
        self.dtype = spec.get("dtype", "float64")
        self.lines = []
        self.count = 0
        # (variable, wants ids, is a Sequential, runs in a Sequential): modules a node may share
        self.done = []
        self.tie_sources = []  # variables of Linear and Embedding leaves
        self.wraps = []        # (plain path, wrapper names innermost first), post-order
        root = self.container(spec["root"], "", False)
        if root is None:
            root = self.new(f"Block({self.dim})")
        self.wraps.append(("", list(spec["root"].get("wrappers", []))))
        self.root = root

    def new(self, expression):
        var = f"m{self.count}"
        self.count += 1
        self.lines.append(f"{var} = {expression}")
        return var

    @staticmethod
    def join(path, name):
        return f"{path}.{name}" if path else name

    def leaf(self, n):
        kind = n.get("leaf", "Linear")
        var = self.new(LEAVES[kind].format(d=self.dim))
        if n.get("frozen"):
            self.lines.append(f"freeze({var})")
        if kind in TIEABLE:
            tie = int(n.get("tie", -1))
            if tie >= 0 and self.tie_sources:
                source = self.tie_sources[tie % len(self.tie_sources)]
                self.lines.append(f"{var}.weight = {source}.weight  # tied")
            self.tie_sources.append(var)
        return var, kind == "Embedding"

    def node(self, n, path, in_sequential):
        """(variable, wants ids), or (None, False) where the C++ builder skips the node."""
        kind = n.get("type", "leaf")
        wrappers = list(n.get("wrappers", []))
        if kind == "shared":
            candidates = [d for d in self.done
                          if not in_sequential or (not d[1] and not d[2] and d[3])]
            if not candidates:
                return None, False
            var, ids, _, _ = candidates[int(n.get("shared", 0)) % len(candidates)]
            self.wraps.append((path, wrappers))
            return var, ids
        ids = False
        if kind == "leaf":
            if in_sequential and n.get("leaf") in ("Embedding", "TorchLinear"):
                return None, False
            var, ids = self.leaf(n)
        else:
            var = self.container(n, path, in_sequential)
            if var is None:
                return None, False
        listing = kind == "container" and n.get("container") in ("ModuleList", "ModuleDict")
        if not listing:
            self.wraps.append((path, wrappers))
            self.done.append((var, ids, kind == "container" and
                              n.get("container") == "Sequential",
                              n.get("leaf") != "TorchLinear"))
        return var, ids

    @staticmethod
    def unique(raw, names):
        name = raw or "m"
        while name in names:
            name += "_"
        names.add(name)
        return name

    def container(self, n, path, in_sequential):
        c = n.get("container", "Custom")
        if c == "Custom":
            block = self.new(f"Block({self.dim})")
            names = set()
            for raw, child in n.get("children", []):
                name = self.unique(raw, names)
                if child.get("type") == "container" and child.get("container") in (
                        "ModuleList", "ModuleDict"):
                    var, ids = self.elements(child, self.join(path, name))
                else:
                    var, wants = self.node(child, self.join(path, name), False)
                    if var is None:
                        continue
                    ids = [wants]
                self.lines.append(f"{block}.add({name!r}, {var}, {ids!r})")
            return block
        if c == "Sequential":
            if in_sequential:
                return None
            members = []
            for _, child in n.get("children", []):
                if child.get("type") == "container" and child.get("container") != "Custom":
                    continue
                var, _ = self.node(child, self.join(path, str(len(members))), True)
                if var is not None:
                    members.append(var)
            if not members:
                return None
            return self.new(f"nn.Sequential({', '.join(members)})")
        return None  # ModuleList and ModuleDict only as a Block's child

    def elements(self, n, path):
        ids = []
        if n.get("container") == "ModuleList":
            members = []
            for _, child in n.get("children", []):
                if child.get("type") == "container" and child.get("container") != "Custom":
                    continue
                var, wants = self.node(child, self.join(path, str(len(members))), False)
                if var is None:
                    continue
                members.append(var)
                ids.append(wants)
            return self.new(f"nn.ModuleList([{', '.join(members)}])"), ids
        members, names = [], set()
        for raw, child in n.get("children", []):
            if child.get("type") == "container" and child.get("container") != "Custom":
                continue
            name = raw or "m"
            if name in names:
                name = self.unique(name, names)
            var, wants = self.node(child, self.join(path, name), False)
            if var is None:
                continue
            names.add(name)
            members.append(f"({name!r}, {var})")
            ids.append(wants)
        return self.new(f"nn.ModuleDict([{', '.join(members)}])"), ids

    def wrap_lines(self, apply):
        """Statements that wrap the model at every wrap point, innermost first, post-order:
        `apply(name, target)` is the expression that wraps `target` with the wrapper `name`."""
        lines = [f"model = {self.root}"]
        for path, names in self.wraps:
            for name in names:
                if path:
                    lines.append(f"put(model, {path!r}, {apply(name, f'at(model, {path!r})')})")
                else:
                    lines.append(f"model = {apply(name, 'model')}")
        return lines


# ---------------------------------------------------------------------------------------------
# What the properties need


class Tensors:
    """Numbers each distinct tensor (storage, offset, shape, stride, dtype) across the models
    of one case, so identity compares across them."""

    def __init__(self):
        self.ids, self.table = {}, []

    def id(self, t):
        key = (t.storage().data_ptr() if t.device.type != "meta" else id(t), t.storage_offset(),
               tuple(t.shape), tuple(t.stride()), str(t.dtype))
        if key not in self.ids:
            self.ids[key] = len(self.table)
            data = t.detach()
            digest = hashlib.sha1(data.contiguous().view(-1).view(torch.uint8).numpy()
                                  .tobytes()).hexdigest()[:16] if data.device.type == "cpu" else ""
            self.table.append({"shape": list(t.shape), "dtype": str(t.dtype)[6:],
                               "digest": digest})
        return self.ids[key]


def state(model, tensors):
    """[key, tensor number, requires_grad] for every entry of the model's state dict, now."""
    return [[k, tensors.id(v), bool(v.requires_grad)]
            for k, v in model.state_dict(keep_vars=True).items()]


def modules(model, objects):
    """[path, class, number of the module object, its own parameter and buffer names, its
    training flag] for every path (shared modules repeated)."""
    out = []
    for path, m in model.named_modules(remove_duplicate=False):
        local = [n for n, t in list(m._parameters.items()) + list(m._buffers.items())
                 if t is not None]
        out.append([path, type(m).__name__, objects.setdefault(id(m), len(objects)), local,
                    bool(m.training)])
    return out


def values(t):
    """A tensor's values as float64, little-endian, eight bytes apiece, in one hex string: exact
    in every floating dtype (NaN and infinities too), and converted in C on both sides."""
    return t.detach().to("cpu", torch.float64).reshape(-1).numpy().astype("<f8").tobytes().hex()


def run(model, x, probe, tensors):
    """Output (values and shape) and gradients (by tensor number) of one forward and backward
    on the batch `x`, and under "single" the same for its first example alone."""
    out = run_once(model, x, probe, tensors)
    out["single"] = run_once(model, x[:1], probe, tensors)
    return out


def run_once(model, x, probe, tensors):
    model.zero_grad(set_to_none=True)
    if x.is_floating_point():
        x = x.detach().requires_grad_(True)  # a reentrant checkpoint needs an input that does
    out = model(x)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    grads = {}
    for _, p in probe:
        if p.grad is not None:
            grads[str(tensors.id(p))] = values(p.grad)
    if x.is_floating_point() and x.grad is not None:
        grads["input"] = values(x.grad)
    return {"output": values(out), "shape": list(out.shape), "grads": grads}


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1


def resolve_wrappers(names):
    return {name: wrapper_callable(name) for name in names}


def resolve_case(req, wraps):
    """The wrappers a case names at `wraps`, its unwrap subject and its release function (None
    for the reference port and for none); what does not import fails the case."""
    names = sorted({n for _, ns in wraps for n in ns})
    try:
        return (resolve_wrappers(names), subject(req.get("unwrap")),
                subject(req.get("release")))
    except Exception as e:
        raise Failure("import", "", f"{type(e).__name__}: {e}")


def unwrap_case(req, unwrap_fn, wrapped, kinds):
    """The subject's result for `wrapped`; what it raises, or anything but a module it gives
    back, fails the case naming it."""
    who = req.get("unwrap") or "the reference port"
    try:
        unwrapped = unwrap_fn(wrapped) if unwrap_fn else PORT["unwrap"](wrapped, kinds)
    except Exception as e:
        raise Failure("unwrap", who, f"{type(e).__name__}: {e}")
    if not isinstance(unwrapped, nn.Module):
        raise Failure("unwrap", who,
                      f"gave back a {type(unwrapped).__name__}, not a torch.nn.Module")
    return unwrapped


def subject(name):
    if not name:
        return None
    return import_path(name)


def save_and_load(unwrapped, fresh, what):
    """What `unwrapped` saves with torch.save, loaded strictly into `fresh`; None when it loads,
    else what went wrong (`what` names the model saved)."""
    import io
    buffer = io.BytesIO()
    try:
        torch.save({k: v.detach() for k, v in unwrapped.state_dict().items()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
    except Exception as e:
        return f"saving {what}'s state dict: {type(e).__name__}: {e}"
    try:
        fresh.load_state_dict(saved, strict=True)
    except Exception as e:
        return (f"loading it into a fresh model: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}")
    return None


def round_trip(unwrapped, make, seed, want):
    """P10: what the unwrapped model saves loads strictly into a freshly built model and gives
    it the model's values. Empty when it does; else what went wrong."""
    fresh = make(seed + 1)
    error = save_and_load(unwrapped, fresh, "the unwrapped model")
    if error:
        return {"error": error}
    for key, value in fresh.state_dict().items():
        if key not in want or not torch.equal(value, want[key].detach()):
            return {"error": "a fresh model loaded from it differs from the model", "key": key}
    return {}


def build_spec(builder, seed):
    """The generated model, freshly built from the spec's statements."""
    torch.manual_seed(seed)
    ns = dict(MODELS)
    try:
        exec("\n".join(builder.lines), ns)
    except KeyError as e:
        if "already exists" in str(e):
            # A child named like a method of nn.Module ("modules"): LibTorch allows it, PyTorch
            # does not, so the case does not exist in Python.
            raise Failure("unbuildable", "", f"PyTorch refuses a child name: {e}")
        raise Failure("build", "", f"{type(e).__name__}: {e}")
    except Exception as e:
        raise Failure("build", "", f"{type(e).__name__}: {e}")
    model = ns[builder.root]
    if builder.dtype != "float64":
        model.to(DTYPES[builder.dtype])  # the same Parameter objects: ties stay ties
    return model


def sample(builder, seed, examples):
    """The input of `examples` examples drawn from `seed`, in the tree's dtype."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(examples, builder.dim, generator=gen).to(DTYPES[builder.dtype])


def run_case(req):
    builder = Builder(req["spec"])
    seed = int(req.get("seed", 0))
    if req.get("steps"):
        return train_case(req, builder, seed)
    x = sample(builder, seed + 7919, builder.batch * world()[1])
    return observe(req, lambda s: build_spec(builder, s), builder.wraps, x, builder.batch,
                   builder.eval)


class Trainer:
    """An optimizer over a model's parameters (each once, as `model.parameters()` gives them),
    stepping a float64 master copy of each parameter of another dtype and rounding it back, as
    wrapcert's C++ training loop does: the update then does not depend on how a wrapper lays the
    parameters out (one flat tensor stepped whole rounds otherwise than its pieces)."""

    def __init__(self, kind, params, rate, momentum):
        self.params = list(params)
        if self.params:  # what torch.optim refuses in the parameters given, it refuses here
            torch.optim.SGD(self.params, lr=rate)
        self.masters = [None if p.dtype == torch.float64 else
                        p.detach().to(torch.float64).requires_grad_(p.requires_grad)
                        for p in self.params]
        stepped = [p if m is None else m for p, m in zip(self.params, self.masters)]
        if not stepped:  # a model without parameters: nothing to step
            self.optimizer = None
        elif kind == "adam":
            self.optimizer = torch.optim.Adam(stepped, lr=rate)
        else:
            self.optimizer = torch.optim.SGD(stepped, lr=rate, momentum=momentum)

    def step(self):
        for p, m in zip(self.params, self.masters):
            if m is not None:
                m.grad = None if p.grad is None else p.grad.detach().to(torch.float64)
        if self.optimizer is not None:
            self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if m is not None:
                    p.copy_(m)


def forward_backward(model, x, params):
    """Output, and the gradient of each of `params` (None where none reached it)."""
    model.zero_grad(set_to_none=True)
    if x.is_floating_point():
        x = x.detach().requires_grad_(True)  # a reentrant checkpoint needs an input that does
    out = model(x)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    return out.detach(), [None if p.grad is None else values(p.grad) for p in params]


def reduce_grads(params, reduced, ranks):
    """The gradients of `params` at the indices of `reduced` (each tensor once: a tied one is
    one index) summed over the ranks (divided by their number for "mean"), in place, each in
    turn on every rank; then every parameter's gradient as sent (a tie's other keys see the
    reduced gradient too). Gloo in PyTorch 1.13 reduces no bfloat16: reduced in float32 and
    rounded once."""
    import torch.distributed as dist
    for k in sorted(reduced):
        g = params[k].grad
        if g is None:
            continue
        wide = g.to(torch.float32) if g.dtype == torch.bfloat16 else g
        dist.all_reduce(wide)
        if reduced[k] == "mean":
            wide.div_(ranks)
        if wide is not g:
            g.copy_(wide)
    return [None if p.grad is None else values(p.grad) for p in params]


def train_case(req, builder, seed):
    """P17: the model and a wrapped copy of it trained side by side through `req["steps"]`;
    after each step what both computed, each module's mode, each tensor's requires_grad and
    values. Then the trained copy unwrapped by the subject, saved with torch.save, loaded
    strictly into a fresh model, and both run on a probe."""
    rank, ranks = world()
    wrappers, unwrap_fn, _ = resolve_case(req, builder.wraps)
    plain = build_spec(builder, seed)
    copy_ = build_spec(builder, seed)
    plain_state = list(plain.state_dict(keep_vars=True).items())
    copy_state = list(copy_.state_dict(keep_vars=True).items())
    tensors = Tensors()
    result = {"original": state(copy_, tensors)}
    training = not builder.eval
    plain.train(training)
    wrapped, made, kinds = wrap_all(copy_, builder.wraps, wrappers, req.get("slots") or {})
    if not training:
        wrapped.eval()
    result["wrapped"] = state(wrapped, tensors)
    result["wrapped_tree"] = repr(wrapped)
    probe = [t for _, t in copy_state]
    want_probe = [t for _, t in plain_state]
    # Across ranks, the model trains as data parallelism trains it: a parameter a reducing
    # wrapper holds (a DistributedDataParallel, or one declared with --reduction) steps on the
    # mean (or the sum) over the ranks of the gradients their slices give the model, reduced with
    # torch.distributed as the wrapper reduces; every other parameter on this rank's own.
    reduced = {}
    if ranks > 1:
        declared = req.get("reductions") or {}
        index = {id(t): k for k, t in enumerate(probe)}
        for name, w, slot, _ in made:
            how = declared.get(name) or (
                "mean" if isinstance(w, nn.parallel.DistributedDataParallel) else None)
            # What the wrapper holds, read from its slot (not its own parameters(): what it
            # reduces is what it holds, however it lists it).
            for t in w._modules[slot].parameters() if how else ():
                if id(t) in index:
                    reduced[index[id(t)]] = how
    result["world_size"] = ranks
    result["reduced"] = sorted(reduced)
    optimizer = req.get("optimizer", "sgd")
    rate, momentum = float(req.get("rate", 0.01)), float(req.get("momentum", 0.9))
    wrapped_trainer = None
    plain_trainer = Trainer(optimizer, plain.parameters(), rate, momentum)
    steps = []
    for i, (what, n) in enumerate(req["steps"]):
        step = {"what": what, "batch": n}
        steps.append(step)
        x = sample(builder, int(req.get("input_seed", 100)) + i, n * ranks)[n * rank:n * (rank + 1)]
        if what == "switch_mode":
            training = not training
        step["training"] = training
        who = "the wrapped model"
        try:
            if what == "train":
                got = forward_backward(wrapped, x, probe)
                who = "the model"
                want = forward_backward(plain, x, want_probe)
                if reduced:
                    want = (want[0], reduce_grads(want_probe, reduced, ranks))
                step["output"], step["grads"] = values(got[0]), got[1]
                step["want_output"], step["want_grads"] = values(want[0]), want[1]
                who = "the optimizer step over the wrapped model's parameters"
                if wrapped_trainer is None:
                    wrapped_trainer = Trainer(optimizer, wrapped.parameters(), rate, momentum)
                wrapped_trainer.step()
                who = "the model's optimizer step"
                plain_trainer.step()
            else:
                if what == "switch_mode":
                    who = "train()" if training else "eval()"
                    wrapped.train(training)
                    plain.train(training)
                    who = "the wrapped model"
                with torch.no_grad() if what == "no_grad" else torch.enable_grad():
                    got = wrapped(x)
                    who = "the model"
                    want = plain(x)
                step["output"], step["want_output"] = values(got), values(want)
        except Exception as e:
            step["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            step["who"] = who
            break
        step["modes"] = [[p, bool(m.training)]
                         for p, m in wrapped.named_modules(remove_duplicate=False)]
        step["requires_grad"] = [bool(t.requires_grad) for t in probe]
        step["want_requires_grad"] = [bool(t.requires_grad) for t in want_probe]
        step["values"] = [values(t) for t in probe]
        step["want_values"] = [values(t) for t in want_probe]
        step["shapes"] = [[list(t.shape), str(t.dtype)[6:]] for t in probe]
        step["want_shapes"] = [[list(t.shape), str(t.dtype)[6:]] for t in want_probe]
    result["steps"] = steps
    result["step_count"] = len(req["steps"])
    if steps and "error" in steps[-1]:
        result["tensors"] = tensors.table
        return result
    # The scenario wrapcert began with: the trained model unwrapped, saved, loaded, run.
    unwrapped = unwrap_case(req, unwrap_fn, wrapped, kinds)
    result["unwrapped"] = state(unwrapped, tensors)
    result["tensors"] = tensors.table
    checkpoint = {}
    result["checkpoint"] = checkpoint
    fresh = build_spec(builder, int(req.get("fresh_seed", 99)))
    error = save_and_load(unwrapped, fresh, "the trained model")
    if error:
        checkpoint["error"] = error
        return result
    fresh.train(training)
    x = sample(builder, int(req.get("probe_seed", 200)), 1)
    with torch.no_grad():
        checkpoint["output"] = values(fresh(x))
        checkpoint["want_output"] = values(plain(x))
    return result


FIXTURES = {}


def run_fixture(req):
    config = req["config"]
    if not FIXTURES:
        exec(compile(read_text("wrapcert_fixtures.py"), "wrapcert_fixtures.py", "exec"), FIXTURES)
    fixtures = FIXTURES

    def make(seed):
        torch.manual_seed(seed)
        return fixtures["build"](config)[0]

    layers = fixtures["build"](config)[1]
    names = list(req.get("wrappers", []))
    wraps = [(path, names) for path in layers] + [("", names)]
    seed = int(req.get("seed", 0))
    ids = torch.randint(1, config["vocab_size"], (2 * world()[1], 5),
                        generator=torch.Generator().manual_seed(seed + 7919))
    return observe(req, make, wraps, ids, 2, False)


def observe(req, make, wraps, batch, per_rank, eval_mode):
    """One case: the model made by `make(seed)`, wrapped at `wraps` ([(path, wrapper names
    innermost first)], post-order), unwrapped by the subject; what the properties need. `batch`
    is the global batch: `per_rank` examples per rank, this rank running its own. In eval mode
    the model runs in eval mode, and the wrapped model is switched to it through its wrappers
    (`eval()` on the wrapped model, as a user calls it)."""
    rank, ranks = world()
    x = batch[per_rank * rank:per_rank * (rank + 1)]
    wrappers, unwrap_fn, release_fn = resolve_case(req, wraps)
    seed = int(req.get("seed", 0))
    model = make(seed)
    first = model
    tensors, objects = Tensors(), {}
    result = {"original": state(model, tensors), "original_modules": modules(model, objects)}
    original = model.state_dict(keep_vars=True)  # the model's own tensors, before wrapping
    probe = list(model.named_parameters())
    if not req.get("numerics"):
        x = None
    else:
        try:
            model.train(not eval_mode)
            result["run_original"] = run(model, x, probe, tensors)
            if ranks > 1:  # every rank's slice on the plain model: what a reduction must give
                result["run_slices"] = [
                    run(model, batch[per_rank * r:per_rank * (r + 1)], probe, tensors)
                    for r in range(ranks)]
            model.train()  # wrapped as built, then switched through the wrappers
        except Exception as e:
            raise Failure("run", "the generated model", f"{type(e).__name__}: {e}")

    # Wrap, innermost first, post-order; remember each wrapper's class and slot.
    model, made, kinds = wrap_all(model, wraps, wrappers, req.get("slots") or {})
    wrapped = model
    if eval_mode:
        wrapped.eval()
    # Each wrapper: its name, class, slot, path in the model, the tensors of the parameters it
    # holds, how it reduces their gradients across ranks as its class promises ("mean" for
    # DistributedDataParallel and its subclasses; None), what it holds itself besides its slot
    # ([name, what, one of the model's own modules or tensors, persistent]), and its path in the
    # wrapped model.
    model_modules = {id(m) for m in first.modules()}
    model_tensors = {t for _, t, _ in result["original"]}
    where = {}
    for path, m in wrapped.named_modules(remove_duplicate=False):
        where.setdefault(id(m), path)

    def own(w, slot):
        items = [[k, "module", id(c) in model_modules, True]
                 for k, c in w._modules.items() if k != slot and c is not None]
        items += [[k, "parameter", tensors.id(t) in model_tensors, True]
                  for k, t in w._parameters.items() if t is not None]
        items += [[k, "buffer", tensors.id(t) in model_tensors,
                   k not in w._non_persistent_buffers_set]
                  for k, t in w._buffers.items() if t is not None]
        return items

    aliases = req.get("aliases") or {}

    def reaches(w, slot, name):
        """[alias, it is the module in the slot, the class of what it reaches (None: nothing)]"""
        try:
            got = getattr(w, name)
        except Exception:
            return [name, False, None]
        return [name, got is w._modules.get(slot), type(got).__name__]

    result["wrappers"] = [[n, type(w).__name__, s, p,
                           sorted({tensors.id(t) for t in w.parameters()}),
                           "mean" if isinstance(w, nn.parallel.DistributedDataParallel) else None,
                           own(w, s), where.get(id(w)),
                           [reaches(w, s, a) for a in aliases.get(n, [])]]
                          for n, w, s, p in made]
    result["wrapped"] = state(wrapped, tensors)
    result["wrapped_modules"] = modules(wrapped, objects)
    result["wrapped_tree"] = repr(wrapped)

    unwrapped = unwrap_case(req, unwrap_fn, wrapped, kinds)
    result["unwrapped"] = state(unwrapped, tensors)
    result["unwrapped_modules"] = modules(unwrapped, objects)
    result["unwrapped_tree"] = repr(unwrapped)
    result["unwrapped_wrappers"] = [
        p for p, m in unwrapped.named_modules(remove_duplicate=False) if type(m) in kinds]
    result["wrapped_after"] = state(wrapped, tensors)
    result["wrapped_modules_after"] = modules(wrapped, objects)
    result["round_trip"] = round_trip(unwrapped, make, seed, original)
    result["unwrapped_is_wrapped"] = unwrapped is wrapped
    result["unwrapped_is_model"] = unwrapped is first
    try:
        again = unwrap_fn(unwrapped) if unwrap_fn else PORT["unwrap"](unwrapped, kinds)
        result["again"] = state(again, tensors)
        result["again_is_unwrapped"] = again is unwrapped
    except Exception as e:
        result["again_error"] = f"{type(e).__name__}: {e}"

    if x is not None:
        counters = []
        for _, w, _, _ in made:
            counter = Counter()
            counters.append((counter, w.register_forward_pre_hook(counter)))
        try:
            result["run_wrapped"] = run(wrapped, x, probe, tensors)
            result["wrapped_calls"] = [c.calls for c, _ in counters]
            for c, _ in counters:
                c.calls = 0
            try:
                result["run_unwrapped"] = run(unwrapped, x, probe, tensors)
            except Exception as e:
                result["run_unwrapped_error"] = f"{type(e).__name__}: {e}"
            result["unwrapped_calls"] = [c.calls for c, _ in counters]
        except Exception as e:
            result["run_wrapped_error"] = f"{type(e).__name__}: {e}"
        finally:
            for _, handle in counters:
                handle.remove()
    if release_fn is not None:
        # A permanent unwrap (P14): last, since it may take the wrappers apart.
        try:
            released = release_fn(wrapped)
            if not isinstance(released, nn.Module):
                raise TypeError(f"gave back a {type(released).__name__}, not a torch.nn.Module")
            result["released"] = state(released, tensors)
            result["released_wrappers"] = [
                p for p, m in released.named_modules(remove_duplicate=False) if type(m) in kinds]
            if x is not None:
                result["run_released"] = run(released, x, probe, tensors)
        except Exception as e:
            result["release_error"] = f"{type(e).__name__}: {e}"
    result["tensors"] = tensors.table
    return result


def at(model, path):
    return MODELS["at"](model, path)


def wrap_all(model, wraps, wrappers, slots):
    """Wraps `model` at `wraps`, innermost first, post-order: the wrapped model, the wrappers
    made ([(name, wrapper, slot, path)]) and every wrapper class known with its slot."""
    kinds = dict(KNOWN_KINDS)
    made = []
    for path, stack in wraps:
        for name in stack:
            inner = at(model, path)
            try:
                wrapper = wrappers[name](inner)
            except Exception as e:
                raise Failure("wrap", name, f"{type(e).__name__}: {e}")
            if wrapper is inner:
                raise Failure("contract", name, "the wrapper gave back the module it was given")
            if not isinstance(wrapper, nn.Module):
                raise Failure("contract", name, f"the wrapper gave back a "
                              f"{type(wrapper).__module__}.{type(wrapper).__qualname__}, not a "
                              "torch.nn.Module")
            slot = slots.get(name) or next(
                (k for k, v in wrapper._modules.items() if v is inner), None)
            if slot is None:
                raise Failure("contract", name, f"a {type(wrapper).__name__} holds the module it "
                              "wraps in no child of its own: give its slot with --slot")
            kinds.setdefault(type(wrapper), slot)
            made.append((name, wrapper, slot, path))
            if path:
                MODELS["put"](model, path, wrapper)
            else:
                model = wrapper
    return model, made, kinds


# ---------------------------------------------------------------------------------------------
# Repro scripts


def wrapper_source(name):
    """Import lines and the callable's expression for a repro script."""
    if name in BUILTINS:
        return BUILTINS[name][1], BUILTINS[name][2]
    module_name, _, attrs = name.partition(":")
    alias = "wrap_" + "".join(ch if ch.isalnum() else "_" for ch in attrs)
    return [f"from {module_name} import {attrs.split('.')[0]} as {alias}_root",
            f"{alias} = {alias}_root" + "".join("." + a for a in attrs.split(".")[1:])], alias


def repro(req):
    spec = req["spec"]
    seed = int(req.get("seed", 0))
    builder = Builder(spec)
    names = sorted({n for _, ns in builder.wraps for n in ns})
    imports, calls = [], {}
    for name in names:
        lines, expression = wrapper_source(name)
        imports += [line for line in lines if line not in imports]
        calls[name] = expression
    unwrap_name = req.get("unwrap")
    ranks = int(req.get("world_size", 1))
    out = ["#!/usr/bin/env python3",
           "# A counterexample found by `wrapcert certify-python`, standalone: it builds the",
           "# model, wraps it, unwraps it and shows where the unwrapped model differs.",
           "# Run it with an interpreter that has PyTorch (Debian: /usr/bin/python3)."]
    if ranks > 1:
        out += [f"# It runs as {ranks} ranks of torch.distributed (gloo), started as torchrun starts",
                f"# them: torchrun --nproc_per_node {ranks} THIS_FILE, or {ranks} processes with",
                "# RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; each rank runs its slice",
                "# of the batch and prints what differs on it."]
    out += ["import os", "import sys", "", PRELUDE.rstrip(), ""]
    out += ["import torch.distributed as dist",
            "RANK, WORLD = int(os.environ.get('RANK', '0')), int(os.environ.get('WORLD_SIZE', '1'))",
            f"if WORLD != {ranks}:",
            f"    sys.exit('this counterexample runs at world size {ranks}, not %d' % WORLD)",
            "if WORLD > 1:",
            "    import datetime",
            "    dist.init_process_group('gloo', init_method='env://',",
            "                            timeout=datetime.timedelta(seconds=120))",
            f"REDUCTIONS = {dict(req.get('reductions') or {})!r}  # declared: wrapper -> mean or sum",
            ""]
    out += imports
    def import_as(name, alias):
        """Lines that import `package.module:attr.path` as `alias`."""
        module_name, _, attr = name.partition(":")
        first, *rest = attr.split(".")
        return [f"from {module_name} import {first} as {alias}_root",
                f"{alias} = {alias}_root" + "".join("." + a for a in rest)]

    if unwrap_name:
        out += import_as(unwrap_name, "unwrap")
    else:
        port = UNWRAP_PORT.rstrip().replace("def unwrap(model, kinds):",
                                            "def unwrap_port(model, kinds):")
        out += ["", "# wrapcert's reference unwrap (Python port)", port, ""]
    release_name = req.get("release")
    if release_name:
        out += import_as(release_name, "release")
    out += [f"ALIASES = {dict(req.get('aliases') or {})!r}  # declared with --alias",
            f"SLOTS = {dict(req.get('slots') or {})!r}  # given with --slot",
            f"OWNED = {dict(req.get('owned_state') or {})!r}  # declared with --owned-state",
            "", ""]
    out += REPRO_HELPERS.splitlines()
    dtype = f"torch.{builder.dtype}"
    out += ["", "", f"torch.manual_seed({seed})"] + builder.lines
    if builder.dtype != "float64":
        out += [f"{builder.root}.to({dtype})  # the model's dtype"]
    per_rank = builder.batch
    out += ["original = {k: v for k, v in " + builder.root +
            ".state_dict(keep_vars=True).items()}",
            "storages = {k: storage(v) for k, v in original.items()}",
            "flags = {k: v.requires_grad for k, v in original.items()}",
            f"MODE = {not builder.eval!r}  # the model's mode: True training, False eval",
            f"# the global batch: {per_rank} examples per rank, this rank running its own",
            f"PER_RANK = {per_rank}",
            f"batch = torch.randn(PER_RANK * WORLD, {builder.dim}, "
            f"generator=torch.Generator().manual_seed({seed + 7919})).to({dtype})",
            f"runs = [('a batch', {per_rank}), ('a single example', 1)]"]
    if req.get("numerics"):
        out += [f"{builder.root}.train(MODE)",
                "before, summed = {}, {}",
                "for label, n in runs:",
                f"    before[label] = run({builder.root}, batch[{per_rank} * RANK:{per_rank} * RANK + n])",
                "    # what a wrapper that averages (or sums) gradients across ranks must give",
                f"    slices = [run({builder.root}, batch[{per_rank} * r:{per_rank} * r + n])[1]"
                " for r in range(WORLD)]",
                "    summed[label] = {k: sum(s[k] for s in slices)",
                "                     if all(s[k] is not None for s in slices) else None",
                "                     for k in slices[0]}",
                f"{builder.root}.train()  # wrapped as built, then switched through the wrappers"]
    out += ["", "# wrapping, innermost wrapper first, children before parents"]
    out += builder.wrap_lines(lambda n, target: f"wrap({n!r}, {calls[n]}, {target})")
    out += ["model.train(MODE)  # as a user switches a wrapped model: through its wrappers"]
    if not unwrap_name:
        out += ["unwrap = lambda m: unwrap_port(m, kinds)"]
    out += REPRO_CHECKS.splitlines()
    if req.get("numerics") and not req.get("steps"):
        out += REPRO_NUMERICS.splitlines()
    if req.get("steps"):
        out += ["", "", "# The training loop (P17): the model built again, trained without "
                "wrappers beside the wrapped one.",
                f"torch.manual_seed({seed})"] + builder.lines
        if builder.dtype != "float64":
            out += [f"{builder.root}.to({dtype})"]
        out += [f"plain = {builder.root}",
                f"STEPS = {[list(x) for x in req['steps']]!r}",
                f"OPTIMIZER, RATE, MOMENTUM = {req.get('optimizer', 'sgd')!r}, "
                f"{float(req.get('rate', 0.01))!r}, {float(req.get('momentum', 0.9))!r}",
                f"INPUT_SEED, PROBE_SEED = {int(req.get('input_seed', 100))}, "
                f"{int(req.get('probe_seed', 200))}",
                f"DIM, DTYPE = {builder.dim}, {dtype}", "", ""]
        out += inspect.getsource(Trainer).splitlines() + ["", ""]
        out += REPRO_TRAINING.splitlines()
        out += [f"torch.manual_seed({int(req.get('fresh_seed', 99))})"] + builder.lines
        if builder.dtype != "float64":
            out += [f"{builder.root}.to({dtype})"]
        out += [f"fresh = {builder.root}"] + REPRO_CHECKPOINT.splitlines()
    if release_name:
        out += REPRO_RELEASE.splitlines()
    out += ["for p in problems:", "    print(f'PROBLEM (rank {RANK}):' if WORLD > 1 else 'PROBLEM:', p)",
            "sys.exit(1 if problems else 0)", ""]
    return "\n".join(out)


# What every repro script defines before it builds the model.
REPRO_HELPERS = """
def run(m, x):
    \"\"\"Output, and gradients of the model's tensors and of the input.\"\"\"
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = m(x)
    w = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * w).sum().backward()
    grads = {k: t.grad for k, t in original.items() if t.requires_grad}
    grads['(the input)'] = x.grad
    return out.detach(), grads


def largest(a, b):
    \"\"\"The largest difference between two tensors of one shape; None for others.\"\"\"
    if a is None or b is None or a.shape != b.shape:
        return None
    return (a - b).abs().max() if a.numel() else 0


def storage(t):
    \"\"\"Where a tensor's values live: storage, offset, shape, stride, dtype.\"\"\"
    return (t.storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
            t.dtype)


kinds = {}  # wrapper class -> the child that holds the wrapped module
made = []  # (wrapper name, wrapper, its slot)


def wrap(name, make, inner):
    try:
        wrapper = make(inner)
    except Exception as e:
        print(f'PROBLEM: the wrapper {name} refused the model: {type(e).__name__}: {e}')
        sys.exit(1)
    if not isinstance(wrapper, torch.nn.Module):
        print(f'PROBLEM: the wrapper {name} gave back a {type(wrapper).__name__}, not a module')
        sys.exit(1)
    slot = SLOTS.get(name) or next((k for k, v in wrapper._modules.items() if v is inner), None)
    if slot is None:
        print(f'PROBLEM: the wrapper {name} holds the module it wraps in no child of its own')
        sys.exit(1)
    kinds.setdefault(type(wrapper), slot)
    made.append((name, wrapper, slot))
    return wrapper


def translate(model, key):
    \"\"\"A wrapped key with each wrapper's slot dropped, whether the key spells the slot or the
    wrapper's state-dict hook left it out; None where the key names nothing in the tree.\"\"\"
    parts, m, kept, i = key.split('.'), model, [], 0
    while i < len(parts):
        slot = kinds.get(type(m))
        if slot is not None:
            own = {**m._parameters, **m._buffers}
            if i + 1 == len(parts) and own.get(parts[i]) is not None:
                return '.'.join(kept + [parts[i]])  # the wrapper's own state
            i += parts[i] == slot and i + 1 < len(parts)
            m = m._modules[slot]
            continue
        if i + 1 == len(parts):
            return '.'.join(kept + [parts[i]])
        m = m._modules.get(parts[i])
        if m is None:
            return None
        kept.append(parts[i])
        i += 1
    return None
"""

# The structural checks, after the model is wrapped.
REPRO_CHECKS = """print(model)
wrapped_keys = list(model.state_dict().keys())
wrapped_modules = [(p, type(m).__name__, id(m)) for p, m in model.named_modules(remove_duplicate=False)]
try:
    unwrapped = unwrap(model)
except Exception as e:
    print(f'PROBLEM: unwrapping raised {type(e).__name__}: {e}')
    sys.exit(1)
got = unwrapped.state_dict(keep_vars=True)
problems = []
if WORLD > 1:  # every rank must have built, wrapped and unwrapped the same keys
    mine = [list(original), wrapped_keys, list(got)]
    every = [None] * WORLD
    dist.all_gather_object(every, mine)
    for what, a, b in zip(('model', 'wrapped model', 'unwrapped model'), mine, every[0]):
        if a != b:
            problems.append(f'this rank\\'s {what} has other keys than rank 0\\'s: {a} against {b}')
for key, tensor in got.items():
    if key in flags and tensor.requires_grad != flags[key]:
        problems.append(f'{key}: requires_grad is {tensor.requires_grad} after wrapping and '
                        f'unwrapping, the model\\'s {flags[key]}')
for p, m in unwrapped.named_modules(remove_duplicate=False):
    if m.training != MODE:
        problems.append(f'{p or "the root"} ({type(m).__name__}) is in '
                        f'{"training" if m.training else "eval"} mode after model.train({MODE}) '
                        'through the wrappers')
if list(got) != list(original):
    problems.append('keys differ: the unwrapped model has ' + str(list(got)) +
                    ',\\n  the model had ' + str(list(original)))
for key, tensor in original.items():
    if key in got and got[key] is not tensor:
        problems.append(key + ' is not the model\\'s own tensor after unwrapping')
    elif key in got and storage(got[key]) != storages[key]:
        problems.append(key + ' is the model\\'s tensor object, but its values no longer live in '
                        'the model\\'s storage (storage, offset, shape, stride, dtype '
                        f'{storage(got[key])} against {storages[key]})')
after = [(p, type(m).__name__, id(m)) for p, m in model.named_modules(remove_duplicate=False)]
if list(model.state_dict().keys()) != wrapped_keys:
    problems.append('unwrapping changed the wrapped model: its keys are now ' +
                    str(list(model.state_dict().keys())) + ', they were ' + str(wrapped_keys))
elif after != wrapped_modules:
    problems.append('unwrapping changed the wrapped model: its modules are now ' +
                    str([(p, c) for p, c, _ in after]) + ', they were ' +
                    str([(p, c) for p, c, _ in wrapped_modules]))
# Each wrapped key, its wrappers' slots dropped, is the model's key for the same tensor.
declared = set()
for p, m in model.named_modules(remove_duplicate=False):
    for name, w, slot in made:
        if m is w:
            declared |= {(p + '.' if p else '') + n for n in OWNED.get(name, [])}
for key, tensor in model.state_dict(keep_vars=True).items():
    if key in declared:
        continue
    clean = translate(model, key)
    if clean not in original:
        problems.append(f'keys mapping: the wrapped key {key} translates to {clean}, which the '
                        'model does not have')
    elif original[clean] is not tensor:
        problems.append(f'keys mapping: the wrapped key {key} translates to {clean}, which holds '
                        'another tensor in the model')
# Each declared alias reaches the very module in the wrapper's slot.
for name, w, slot in made:
    for a in ALIASES.get(name, []):
        if getattr(w, a, None) is not w._modules.get(slot):
            problems.append(f'the wrapper {name}\\'s alias {a!r} does not reach the module in '
                            f'its slot {slot!r}')
# What each wrapper holds besides its slot must be declared as its own.
for name, w, slot in made:
    items = [(k, 'module') for k, c in w._modules.items() if k != slot and c is not None]
    items += [(k, 'parameter') for k, t in w._parameters.items() if t is not None]
    items += [(k, 'buffer' if k not in w._non_persistent_buffers_set else
               'non-persistent buffer') for k, t in w._buffers.items() if t is not None]
    for k, what in items:
        if k not in OWNED.get(name, []):
            problems.append(f'the wrapper {name} holds a {what} {k!r} of its own that it does not '
                            f'declare (wrapcert: --owned-state {name}={k})')
"""

# P17: the wrapped model and the plain one trained side by side; the first step where they part
# is shown, then the trained model unwrapped, saved and loaded into a fresh model.
REPRO_TRAINING = """def forward_backward(m, x, params):
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = m(x)
    w = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * w).sum().backward()
    return out.detach(), [p.grad for p in params]


def same(a, b):
    if (a is None) != (b is None):
        return False
    if a is None or a.shape != b.shape:
        return a is None
    if not BOUND[0]:
        return torch.equal(a, b)
    a, b = a.detach().double(), b.detach().double()
    return bool(((a - b).abs() <= BOUND[0] * (b.abs() + 1)).all())


params = list(original.values())
plain_params = list(plain.state_dict(keep_vars=True).values())
# Across ranks, a parameter a reducing wrapper holds steps on the mean (or the sum) over the ranks
# of the gradients their slices give the model, reduced here with torch.distributed; above world
# size 2 the two reductions may add in other orders: compared within 2(N+1) epsilons, widened by
# four times that per optimizer step.
reduce_how = {}
for name, w, slot in made:
    r = REDUCTIONS.get(name) or ('mean' if isinstance(
        w, torch.nn.parallel.DistributedDataParallel) else None)
    for t in w._modules[slot].parameters() if r and WORLD > 1 else []:
        reduce_how[id(t)] = r
reduced = {k: reduce_how[id(p)] for k, p in {id(p): (k, p) for k, p in enumerate(params)}.values()
           if id(p) in reduce_how}  # a tied tensor once
EPS = 2 * (WORLD + 1) * torch.finfo(DTYPE).eps if WORLD > 2 and reduced else 0.0
BOUND = [EPS]
plain.train(MODE)
training = MODE
try:
    mine = Trainer(OPTIMIZER, model.parameters(), RATE, MOMENTUM)
except Exception as e:
    problems.append(f'an optimizer given the wrapped model\\'s parameters raised '
                    f'{type(e).__name__}: {e}')
theirs = Trainer(OPTIMIZER, plain.parameters(), RATE, MOMENTUM)
for i, (what, n) in enumerate(STEPS):
    if problems and WORLD == 1:
        break  # across ranks every rank goes on entering the others' collectives
    at = f'step {i + 1} of {len(STEPS)} ({what}, batch of {n})'
    x = torch.randn(n * WORLD, DIM, generator=torch.Generator().manual_seed(INPUT_SEED + i)).to(
        DTYPE)[n * RANK:n * RANK + n]
    if what == 'switch_mode':
        training = not training
        model.train(training)
        plain.train(training)
    if what == 'train':
        try:
            got, grads = forward_backward(model, x, params)
        except Exception as e:
            problems.append(f'{at}: the wrapped model raised {type(e).__name__}: {e}')
            break
        want, want_grads = forward_backward(plain, x, plain_params)
        for k in sorted(reduced):
            g = plain_params[k].grad
            if g is not None:
                wide = g.float() if g.dtype == torch.bfloat16 else g
                dist.all_reduce(wide)
                if reduced[k] == 'mean':
                    wide.div_(WORLD)
                if wide is not g:
                    g.copy_(wide)
        for key, a, b in zip(original, grads, want_grads):
            if not same(a, b):
                problems.append(f'{at}: the gradient of {key} differs: {a} against {b}')
        try:
            mine.step()
        except Exception as e:
            problems.append(f'{at}: the optimizer step over the wrapped model raised '
                            f'{type(e).__name__}: {e}')
            break
        theirs.step()
        BOUND[0] += 4 * EPS
    else:
        with torch.no_grad() if what == 'no_grad' else torch.enable_grad():
            try:
                got = model(x).detach()
            except Exception as e:
                problems.append(f'{at}: the wrapped model raised {type(e).__name__}: {e}')
                break
            want = plain(x).detach()
    if not same(got, want):
        problems.append(f'{at}: the output through the wrappers differs: {got} against {want}')
    for p, m in model.named_modules(remove_duplicate=False):
        if m.training != training:
            problems.append(f'{at}: {p or "the root"} ({type(m).__name__}) is in '
                            f'{"training" if m.training else "eval"} mode, the model in '
                            f'{"training" if training else "eval"} mode')
            break
    for key, a, b in zip(original, params, plain_params):
        if a.requires_grad != b.requires_grad:
            problems.append(f'{at}: {key} has requires_grad {a.requires_grad}, the model\\'s '
                            f'{b.requires_grad}')
        elif not same(a.detach(), b.detach()):
            problems.append(f'{at}: {key} differs from training without wrappers: {a} against {b}')
"""

REPRO_CHECKPOINT = """if not problems:
    import io
    trained = unwrap(model)
    buffer = io.BytesIO()
    torch.save({k: v.detach() for k, v in trained.state_dict().items()}, buffer)
    buffer.seek(0)
    try:
        fresh.load_state_dict(torch.load(buffer), strict=True)
    except Exception as e:
        problems.append(f'the trained model, unwrapped and saved, does not load into a fresh '
                        f'model: {e}')
    else:
        fresh.train(training)
        x = torch.randn(1, DIM, generator=torch.Generator().manual_seed(PROBE_SEED)).to(DTYPE)
        with torch.no_grad():
            a, b = fresh(x), plain(x)
        if not same(a, b):
            problems.append(f'the trained model, unwrapped, saved and loaded, computes {a} '
                            f'where the trained model computes {b}')
"""

# P14: the permanent unwrap, last (it may take the wrappers apart).
REPRO_RELEASE = """try:
    released = release(model)
except Exception as e:
    released = None
    problems.append(f'the release raised {type(e).__name__}: {e}')
if released is not None:
    kept = released.state_dict(keep_vars=True)
    if list(kept) != list(original):
        problems.append('the released model has keys ' + str(list(kept)) + ', the model had ' +
                        str(list(original)))
    for key, tensor in original.items():
        if key in kept and (kept[key] is not tensor or storage(kept[key]) != storages[key]):
            problems.append(key + ' is not the model\\'s own tensor after release')
    for p, m in released.named_modules(remove_duplicate=False):
        if type(m) in kinds:
            problems.append(f'a {type(m).__name__} is still at {p!r} after release')
    for label, n in runs if 'before' in globals() else []:
        try:
            after = run(released, batch[PER_RANK * RANK:PER_RANK * RANK + n])
        except Exception as e:
            problems.append(f'the released model does not run ({label}): {e}')
            continue
        if after[0].shape != before[label][0].shape or not torch.equal(after[0],
                                                                        before[label][0]):
            problems.append(f'the released model\\'s output differs ({label})')
        for key, a in before[label][1].items():
            b = after[1].get(key)
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                problems.append(f'the gradient of {key} differs in the released run ({label})')
"""

# P4: outputs and gradients, for a batch and a single example.
REPRO_NUMERICS = """# Across ranks, a parameter a reducing wrapper holds gets the mean (or the sum) of the
# slices' gradients; everything else is this rank's own.
how = {}
for name, w, _ in made:
    r = REDUCTIONS.get(name) or ('mean' if isinstance(
        w, torch.nn.parallel.DistributedDataParallel) else None)
    for t in w.parameters() if r and WORLD > 1 else []:
        how.setdefault(id(t), set()).add(r)
for label, n in runs:
    want = before[label]
    for name, m in (('wrapped', model), ('unwrapped', unwrapped)):
        try:
            after = run(m, batch[PER_RANK * RANK:PER_RANK * RANK + n])
        except Exception as e:
            problems.append(f'the {name} model does not run ({label}): {type(e).__name__}: {e}')
            continue
        if after[0].shape != want[0].shape:
            problems.append(f'the {name} output has shape {list(after[0].shape)} where the '
                            f'model\\'s has {list(want[0].shape)} ({label})')
        elif not torch.equal(after[0], want[0]):
            problems.append(f'the {name} output differs ({label}): {after[0]} against {want[0]}, '
                            f'largest difference {(after[0] - want[0]).abs().max()}')
        for key, a in want[1].items():
            b = after[1].get(key)
            ways = how.get(id(original[key]), ()) if name == 'wrapped' and key in original else ()
            if ways and b is not None and summed[label][key] is not None:
                eps = torch.finfo(b.dtype).eps * 2 * (WORLD + 1)
                wants = [summed[label][key] / WORLD if w == 'mean' else summed[label][key]
                         for w in ways]
                if not any(torch.allclose(b, x, rtol=eps, atol=eps) for x in wants):
                    said = ' or the '.join(sorted(ways))
                    problems.append(f'the gradient of {key} in the wrapped run ({label}) is not '
                                    f'the {said} over the ranks of the gradients of their slices: '
                                    f'{b} against {wants[0]}, largest difference '
                                    f'{(b - wants[0]).abs().max()}')
                continue
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                problems.append(f'the gradient of {key} differs in the {name} run ({label}): '
                                f'{b} against {a}, largest difference '
                                f'{largest(a, b)}')
"""


# ---------------------------------------------------------------------------------------------
# The loop


def main():
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the code under test prints must not reach the reply channel
    sys.stdout = sys.stderr
    sys.setrecursionlimit(10000)
    # Started (torch imported): from here on a request's time limit runs.
    replies.write(json.dumps({"ready": True, "torch": torch.__version__}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            op = req.get("op")
            if op == "hello":
                reply = {"ok": True, "torch": torch.__version__,
                         "python": sys.version.split()[0]}
            elif op == "resolve":
                try:
                    join_ranks()
                except Exception as e:
                    raise Failure("join", "", f"rank {world()[0]} of {world()[1]} could not join "
                                  f"the others: {type(e).__name__}: {e}")
                for name in req.get("wrappers", []):
                    try:
                        wrapper_callable(name)
                    except Exception as e:
                        raise Failure("import", name, f"the wrapper '{name}' does not import: "
                                      f"{type(e).__name__}: {e}")
                for field, what in (("unwrap", "unwrap subject"), ("release", "release function")):
                    if req.get(field):
                        try:
                            subject(req[field])
                        except Exception as e:
                            raise Failure("import", req[field], f"the {what} '{req[field]}' does "
                                          f"not import: {type(e).__name__}: {e}")
                reply = {"ok": True, "torch": torch.__version__}
            elif op in ("case", "fixture"):
                # A worker restarted after another rank's fault joins the ranks again first.
                try:
                    join_ranks()
                except Exception as e:
                    raise Failure("join", "", f"rank {world()[0]} of {world()[1]} could not join "
                                  f"the others: {type(e).__name__}: {e}")
                reply = {"ok": True, "case": run_case(req) if op == "case" else run_fixture(req)}
            elif op == "repro":
                reply = {"ok": True, "script": repro(req)}
            elif op == "exit":
                break
            else:
                reply = {"ok": False, "stage": "protocol", "who": "",
                         "error": f"unknown op {op!r}", "traceback": ""}
        except Failure as f:
            reply = {"ok": False, "stage": f.stage, "who": f.who, "error": f.error,
                     "traceback": f.trace}
        except Exception as e:
            reply = {"ok": False, "stage": "worker", "who": "",
                     "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        reply["id"] = req_id
        replies.write(json.dumps(reply) + "\n")


def leave():
    """Ends the worker once its last reply is written: the exit handlers run (the code under test
    may have registered some), but not the interpreter's teardown of every module and of
    LibTorch's operator registry, which costs a third of a second that the caller waits out."""
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
    leave()
