# The modules wrapcert's generated trees are made of, in plain PyTorch. The worker runs this
# text once; a repro script carries it verbatim, so a counterexample runs without wrapcert.
import torch
import torch.nn as nn

torch.set_default_dtype(torch.float64)


def ids_from(x, dim):
    """Token ids for an Embedding, derived from the float input (as the C++ Block does)."""
    return (x.detach().abs() * 1000).to(torch.int64).remainder(dim).select(-1, 0)


class Block(nn.Module):
    """Each child (or each element of a child ModuleList or ModuleDict) gets the input; the
    outputs are summed onto it. `ids` says, per child, which elements take token ids."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.plan = []

    def add(self, name, child, ids):
        self.add_module(name, child)
        self.plan.append((name, ids))

    def forward(self, x):
        out = x
        for name, ids in self.plan:
            child = getattr(self, name)
            if isinstance(child, nn.ModuleDict):
                elements = list(child.values())
            elif isinstance(child, nn.ModuleList):
                elements = list(child)
            else:
                elements = [child]
            if len(elements) != len(ids):
                raise RuntimeError(f"the generated Block was built with {len(ids)} modules at "
                                   f"'{name}' and finds {len(elements)}")
            for element, wants_ids in zip(elements, ids):
                out = out + element(ids_from(x, self.dim) if wants_ids else x)
        return out


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class ScaleWithBuffer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(dim) + 0.5)
        self.register_buffer("running", torch.randn(dim))

    def forward(self, x):
        return x * self.scale + self.running


class ModeScale(nn.Module):
    """Computes by mode, deterministically (as dropout and batch norm compute by mode): x * scale
    in training mode, half of it in eval mode."""

    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        y = x * self.scale
        return y if self.training else y * 0.5

    def extra_repr(self):
        return "eval_factor=0.5"


def freeze(module):
    """Freezes a leaf's own parameters (requires_grad False), as fine-tuning freezes layers."""
    for p in module.parameters(recurse=False):
        p.requires_grad_(False)
    return module


def at(root, path):
    """The module at a dotted path, through each parent's own child table."""
    for name in path.split(".") if path else []:
        root = root._modules[name]
    return root


def put(root, path, module):
    """Puts `module` at a dotted path (not the root), where the parent's forward finds it."""
    parent, _, name = path.rpartition(".")
    at(root, parent)._modules[name] = module
