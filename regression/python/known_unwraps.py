"""Unwrap functions as real projects wrote them, for `wrapcert certify-python --unwrap`: each is
a known way to get unwrapping wrong, and the properties must reject it.

    wrapcert certify-python --wrapper DataParallel --unwrap known_unwraps:root_only
"""


def root_only(model):
    """transformers' `unwrap_model` before the fix (huggingface/transformers PR #29780): follows
    `.module` from the root only, so wrappers nested inside stay in the keys."""
    if hasattr(model, "module"):
        return root_only(model.module)
    return model


def duck_typed_recursive(model):
    """accelerate's recursive unwrap (huggingface/accelerate PR #2595): anything with a
    `.module` is taken for a wrapper, and every parent is rewired in place with setattr."""
    unwrapped = duck_typed_recursive(model.module) if hasattr(model, "module") else model
    for name, child in list(unwrapped.named_children()):
        setattr(unwrapped, name, duck_typed_recursive(child))
    return unwrapped


def copying(model):
    """Unwraps by rebuilding: a deep copy of the root-only result (tensors are copies)."""
    import copy
    return copy.deepcopy(root_only(model))


def type_directed_root(model):
    """Type-directed but not recursive (PyTorch Lightning's and many trainers' shape): peels the
    known wrapper classes off the root, each through its own slot, and stops there, so wrappers
    around inner layers stay in the keys."""
    import torch.nn as nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    slots = {nn.DataParallel: "module", nn.parallel.DistributedDataParallel: "module",
             CheckpointWrapper: "_checkpoint_wrapped_module"}
    while type(model) in slots:
        model = getattr(model, slots[type(model)])
    return model
