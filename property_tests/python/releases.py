"""Permanent unwraps (`wrapcert certify-python --release`): one that gives the model back, and
one per way to get it wrong. Each wrong one must be rejected by P14.

    wrapcert certify-python --wrapper DataParallel --release releases:release
"""
import copy

import torch.nn as nn


def _slots():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    return {nn.DataParallel: "module", nn.parallel.DistributedDataParallel: "module",
            CheckpointWrapper: "_checkpoint_wrapped_module"}


def _peel(module, slots):
    """The module under every wrapper stacked at `module`."""
    while type(module) in slots:
        module = module._modules[slots[type(module)]]
    return module


def release(model):
    """Takes every wrapper out of the tree, in place: each parent gets the module in the
    wrapper's slot, and the root is peeled."""
    slots = _slots()
    model = _peel(model, slots)
    seen = set()

    def visit(m):
        if id(m) in seen:
            return
        seen.add(id(m))
        for name, child in list(m._modules.items()):
            child = _peel(child, slots)
            m._modules[name] = child
            if child is not None:
                visit(child)

    visit(model)
    return model


def release_copy(model):
    """Releases a deep copy: the keys are right, the tensors are not the model's."""
    return release(copy.deepcopy(model))


def release_root(model):
    """Peels the root only: wrappers inside stay."""
    return _peel(model, _slots())
