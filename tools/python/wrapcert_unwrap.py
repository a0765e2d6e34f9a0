# wrapcert's reference unwrap, ported to Python: type-directed (a wrapper is recognised by its
# class, never by a child's name), recursive, non-destructive (the wrapped model is not touched:
# a parent whose children change is a shallow copy with its own child table), each module
# visited once (shared submodules stay shared), a cycle is an error. The C++ reference
# (wrapcert::unwrap) is the specification; `wrapcert certify-python` checks this port with the
# same properties on the same trees.
import copy
from collections import OrderedDict


def unwrap(model, kinds):
    """`model` without the wrappers in `kinds` ({wrapper class: the child slot holding the
    wrapped module}), as a module that shares every parameter and buffer with it."""
    done = {}  # id(module) -> (module, its unwrapped result); the module is kept alive
    on_path = set()

    def strip(module, path):
        seen = set()
        while type(module) in kinds:
            if id(module) in seen:
                raise ValueError(f"a cycle of wrappers at '{path}'")
            seen.add(id(module))
            slot = kinds[type(module)]
            inner = module._modules.get(slot)
            if inner is None:
                raise ValueError(f"the {type(module).__name__} at '{path}' has no child '{slot}'")
            module = inner
        return module

    def visit(module, path):
        module = strip(module, path)
        if id(module) in done:
            return done[id(module)][1]
        if id(module) in on_path:
            raise ValueError(f"a cycle: the module at '{path}' contains itself")
        on_path.add(id(module))
        children = OrderedDict()
        changed = False
        for name, child in module._modules.items():
            if child is None:
                children[name] = None
                continue
            result = visit(child, f"{path}.{name}" if path else name)
            children[name] = result
            changed = changed or result is not child
        on_path.discard(id(module))
        result = module
        if changed:
            result = copy.copy(module)
            result._modules = children
            result._parameters = OrderedDict(module._parameters)
            result._buffers = OrderedDict(module._buffers)
        done[id(module)] = (module, result)
        return result

    return visit(model, "")
