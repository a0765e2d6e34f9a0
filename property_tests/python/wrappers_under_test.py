"""Python wrappers for `wrapcert certify-python --wrapper`: one that keeps every contract, and
one per contract that breaks it. Each faulty one must be rejected by the property named.

    wrapcert certify-python --wrapper wrappers_under_test:Sound
"""
import copy

import torch
import torch.nn as nn


class Sound(nn.Module):
    """A correct wrapper with its own slot name: forward goes through the wrapped module."""

    def __init__(self, module):
        super().__init__()
        self.inner = module

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


class Copying(Sound):
    """Wraps a copy: the wrapped model no longer holds the model's tensors (P2)."""

    def __init__(self, module):
        super().__init__(copy.deepcopy(module))


def copying(module):
    """A wrapper function that wraps a copy (its slot named with --slot)."""
    return Sound(copy.deepcopy(module))


class ExtraState(Sound):
    """Registers a step counter of its own, which no translation of its keys accounts for
    (P8)."""

    def __init__(self, module):
        super().__init__(module)
        self.register_buffer("steps", torch.zeros(1))


class Bypassing(Sound):
    """Forward never reaches the wrapped module: outputs and gradients change (P4)."""

    def forward(self, x):
        return x * 1.0


class NoGrad(Sound):
    """Runs the wrapped module without autograd: its parameters get no gradient (P4)."""

    def forward(self, x):
        with torch.no_grad():
            return self.inner(x)


class Unregistered(nn.Module):
    """Holds the module in a plain list, where no state dict or unwrap can find it."""

    def __init__(self, module):
        super().__init__()
        self.held = [module]

    def forward(self, x):
        return self.held[0](x)


class Crashing(Sound):
    """Kills the process that wraps with it (a segfaulting extension)."""

    def __init__(self, module):
        import os
        import signal
        os.kill(os.getpid(), signal.SIGSEGV)


class Hanging(Sound):
    """Never returns."""

    def __init__(self, module):
        import time
        time.sleep(3600)


class Noisy(Sound):
    """Prints on stdout, from Python and below it, while wrapping and in forward: the worker's
    replies must not be disturbed."""

    def __init__(self, module):
        import os
        super().__init__(module)
        print("wrapping", type(module).__name__)
        os.write(1, b"{\"id\": 0, \"ok\": true}\n")

    def forward(self, x):
        print("forward")
        return self.inner(x)


class SqueezesBatch(Sound):
    """Squeezes the batch dimension away: exact at batch 2, a (dim,) output for a single
    example (P4 at batch 1, by shape)."""

    def forward(self, x):
        return self.inner(x).squeeze(0)


def refuses(module):
    """A wrapper function that refuses every model (a wrapper's missing precondition)."""
    raise ValueError("refused: this wrapper needs a process group")


class NonPersistentState(Sound):
    """Keeps a non-persistent buffer of its own that nobody declared (P15): no state dict shows
    it, yet it is state a release or a checkpoint must account for."""

    def __init__(self, module):
        super().__init__(module)
        self.register_buffer("mask", torch.ones(1), persistent=False)


class RenamesNestedKeys(Sound):
    """A state-dict hook that renames the nested keys' last component (`weight` to `w`): the
    saved keys no longer translate to the model's (P8)."""

    def __init__(self, module):
        super().__init__(module)
        self._register_state_dict_hook(RenamesNestedKeys._rename)

    @staticmethod
    def _rename(module, state_dict, prefix, local_metadata):
        for key in [k for k in state_dict if k.startswith(prefix) and k.endswith(".weight")]:
            state_dict[key[:-len("weight")] + "w"] = state_dict.pop(key)
        return state_dict


class StorageCast(Sound):
    """Casts the wrapped module to float32 in place (`module.float()`, new storages behind the
    same Parameter objects) and computes in float32 (P2: not the model's storage)."""

    def __init__(self, module):
        super().__init__(module.float())

    def forward(self, x):
        return self.inner(x.float() if x.is_floating_point() else x).double()


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class ScalesGradients(Sound):
    """Doubles the gradient flowing into the wrapped module's output: outputs exact, every
    gradient behind it twice the model's (P4)."""

    def forward(self, x):
        return _Twice.apply(self.inner(x))


class PreHooked(Sound):
    """Correct: a forward pre-hook of its own that passes the input on unchanged."""

    def __init__(self, module):
        super().__init__(module)
        self.calls = 0
        self.register_forward_pre_hook(PreHooked._count)

    @staticmethod
    def _count(module, args):
        module.calls += 1
        return args


class ListedBeside(Sound):
    """Correct: keeps the module in its slot and, unregistered, in a plain list beside it."""

    def __init__(self, module):
        super().__init__(module)
        self.also = [module]

    def forward(self, x):
        return self.also[0](x)


# ---------------------------------------------------------------------------------------------
# How models are trained: frozen parameters, modes, no-grad calls, batches, dtypes, optimizer
# steps. Each faulty one is right in a call of the model as built at batch 1 or 2 in float64.


class Unfreezing(Sound):
    """Sets requires_grad on every parameter it wraps: frozen layers train again (P2, P4)."""

    def __init__(self, module):
        super().__init__(module)
        for p in module.parameters():
            p.requires_grad_(True)


class StuckInTraining(Sound):
    """Its own `train()` sets its flag alone: `eval()` leaves the wrapped module training, and
    a module that computes by mode computes otherwise (P2, P17)."""

    def train(self, mode=True):
        self.training = mode
        return self


class ForwardingTrain(Sound):
    """Correct: a `train()` of its own that counts the switches and forwards them."""

    def __init__(self, module):
        super().__init__(module)
        self.switches = 0

    def train(self, mode=True):
        self.switches += 1
        return super().train(mode)


class NoGradScale(Sound):
    """Scales its output under torch.no_grad() (an inference fast path gone wrong): every call
    with gradients is exact (P17, the no-grad call)."""

    def forward(self, x):
        out = self.inner(x)
        return out if torch.is_grad_enabled() else out * 1.5


class ExactNoGrad(Sound):
    """Correct: an inference path of its own under torch.no_grad() that computes the same."""

    def forward(self, x):
        if torch.is_grad_enabled():
            return self.inner(x)
        with torch.no_grad():
            return self.inner(x).clone()


class LargeBatchFault(Sound):
    """Wrong for batches of three or more (a chunking bug): exact at 1 and 2 (P4)."""

    def forward(self, x):
        out = self.inner(x)
        return out * 2 if x.dim() > 0 and x.shape[0] >= 3 else out


class BFloat16Fault(Sound):
    """Wrong in bfloat16 alone (a cast that loses the output's last bits): exact in float64 and
    float32 (P4, the bfloat16 row)."""

    def forward(self, x):
        out = self.inner(x)
        return out + 1 if out.dtype == torch.bfloat16 else out


class StaleGather(Sound):
    """Gathers the parameters' values once, when it wraps, and computes with them on every call
    (swapped in for the call, as a sharded wrapper swaps in what it gathered): exact until an
    optimizer step changes the parameters (P17)."""

    def __init__(self, module):
        super().__init__(module)
        self.gathered = {id(p): p.detach().clone() for p in module.parameters()}

    def forward(self, x):
        live = [(p, p.data) for p in self.inner.parameters() if id(p) in self.gathered]
        for p, _ in live:
            p.data = self.gathered[id(p)]
        try:
            return self.inner(x)
        finally:
            for p, data in live:
                p.data = data


class OptimizerBreaking(Sound):
    """Its `parameters()` also yields a scale it computes (not a leaf tensor): state dicts,
    calls and gradients are the model's, and an optimizer given the wrapped model's parameters
    raises (P17, naming the step)."""

    def parameters(self, recurse=True):
        yield from super().parameters(recurse)
        yield torch.ones(1, requires_grad=True) * 2


# ---------------------------------------------------------------------------------------------
# Across ranks (`--world-size N`): DistributedDataParallel with the reduction a comm hook does.


def _group():
    """torch.distributed's default group: the ranks' one under --world-size N, else a group of
    this process alone."""
    import torch.distributed as dist
    if not dist.is_initialized():
        # A store in this process's memory: nothing left behind on disk.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist


def _keep_local(state, bucket):
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _sum(state, bucket):
    dist = _group()
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
        lambda f: f.value()[0])


def LocalGradients(module):
    """DistributedDataParallel whose comm hook reduces nothing: each rank keeps its own
    gradients (P4 across ranks; at world size 1 it is exact)."""
    _group()
    ddp = nn.parallel.DistributedDataParallel(module)
    ddp.register_comm_hook(None, _keep_local)
    return ddp


def SummingGradients(module):
    """DistributedDataParallel whose comm hook sums the ranks' gradients instead of averaging
    them: right only where it is declared a sum (--reduction ...=sum)."""
    _group()
    ddp = nn.parallel.DistributedDataParallel(module)
    ddp.register_comm_hook(None, _sum)
    return ddp


class StaleReplicaOnRank1(nn.parallel.DistributedDataParallel):
    """DistributedDataParallel that, on every rank but 0, puts back before each forward the
    values its parameters had when it was built (a replica refreshed from a copy taken at wrap
    time rather than from what the optimizer stepped): one call, the keys and the gradients are
    right, but after the first optimizer step rank 1 computes with stale values (P17 across
    ranks). At world size 1 it is exact."""

    def __init__(self, module):
        _group()
        super().__init__(module)
        self.initial = [p.detach().clone() for p in self.module.parameters()]

    def forward(self, *args, **kwargs):
        if _group().get_rank() != 0:
            for p, v in zip(self.module.parameters(), self.initial):
                if not torch.equal(p.data, v):
                    p.data.copy_(v)  # behind autograd's back, as a refresh from a copy would
        return super().forward(*args, **kwargs)


class KillsRank1(Sound):
    """Rank 1 is killed (SIGKILL) while the others wait for it in DistributedDataParallel's
    first broadcast."""

    def __init__(self, module):
        import os
        import signal
        dist = _group()
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(nn.parallel.DistributedDataParallel(module))


class HangsRank1(Sound):
    """Rank 1 never returns; the others wait for it in a collective."""

    def __init__(self, module):
        import time
        dist = _group()
        while dist.get_rank() == 1:
            time.sleep(1)
        super().__init__(nn.parallel.DistributedDataParallel(module))


class StateOnRank1(Sound):
    """Registers a buffer of its own on rank 1 alone (a rank-dependent branch): rank 1 saves a
    key the others do not. Every row fails across ranks, the fixtures' too, and a repro run as
    the ranks exits 1 on rank 1."""

    def __init__(self, module):
        super().__init__(module)
        if _group().get_rank() == 1:
            self.register_buffer("rank_state", torch.zeros(1))


def not_a_module(module):
    """Gives back something that is not a module: a broken contract, named as such."""
    return {"wrapped": module}


class WrongAlias(Sound):
    """Declares `module` as an alias of its slot, but it reaches the wrapper itself (P16):
    duck-typed unwraps that follow `.module` loop or unwrap to the wrong module."""

    @property
    def module(self):
        return self
