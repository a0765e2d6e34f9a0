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
