#!/usr/bin/env python3
"""The seed thread on real PyTorch: wrap a tiny Gemma-like model as the thread did, unwrap it
with the old and the recursive unwrap, and write the state-dict key lists as JSON for
wrapcert's C++ checker (P1, P8).

On a TPU host with torch_xla, the wrapper is torch_xla's SpmdFullyShardedDataParallel with the
seed's auto-wrap policy and checkpoint_module. With --emulate (no torch_xla), a stand-in class of
the same name and layout is used, so the bridge itself can be tested on any machine with torch.

    python3 seed_unwrap.py --out keys.json [--emulate]
"""
import argparse
import json
import math

import torch
import torch.nn as nn

# tiny-gemma, as wrapcert's fixtures define it.
VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128, 64, 128, 2, 4, 1, 16


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class GemmaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)


class PytorchGELUTanh(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x, approximate="tanh")


class GemmaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.rotary_emb = GemmaRotaryEmbedding(HEAD_DIM)

    def forward(self, x):  # enough to run through the wrappers; numerics live in C++
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        w = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(HEAD_DIM), dim=-1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(b, s, -1))


class GemmaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)
        self.act_fn = PytorchGELUTanh()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = GemmaAttention()
        self.mlp = GemmaMLP()
        self.input_layernorm = GemmaRMSNorm(HIDDEN)
        self.post_attention_layernorm = GemmaRMSNorm(HIDDEN)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class GemmaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
        self.layers = nn.ModuleList([GemmaDecoderLayer() for _ in range(LAYERS)])
        self.norm = GemmaRMSNorm(HIDDEN)


class GemmaForCausalLM(nn.Module):
    _no_split_modules = ["GemmaDecoderLayer"]

    def __init__(self):
        super().__init__()
        self.model = GemmaModel()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied


class EmulatedSpmdFullyShardedDataParallel(nn.Module):
    """Stand-in with torch_xla's layout: `_orig_module`, and `module` aliasing it."""

    def __init__(self, module):
        super().__init__()
        self._orig_module = module

    @property
    def module(self):
        return self._orig_module


EmulatedSpmdFullyShardedDataParallel.__name__ = "SpmdFullyShardedDataParallel"


def wrap_like_the_seed(model, emulate):
    if emulate:
        fsdp = EmulatedSpmdFullyShardedDataParallel
        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = fsdp(layer)
        return fsdp(model)
    import functools
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    n = xr.global_runtime_device_count()
    xs.set_global_mesh(xs.Mesh(np.array(range(n)), (n, 1), axis_names=("fsdp", "tensor")))
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={GemmaDecoderLayer})
    return FSDPv2(model, auto_wrap_policy=policy,
                  auto_wrapper_callable=lambda m, *a, **k: FSDPv2(checkpoint_module(m), *a, **k))


def original_unwrap_model(model):
    """transformers' unwrap_model before the fix (the seed thread)."""
    if hasattr(model, "module"):
        return original_unwrap_model(model.module)
    return model


def recursive_unwrap(module):
    """accelerate's extract_model_from_parallel(recursive=True)."""
    unwrapped = recursive_unwrap(module.module) if hasattr(module, "module") else module
    for name, child in unwrapped.named_children():
        setattr(unwrapped, name, recursive_unwrap(child))
    return unwrapped


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--emulate", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GemmaForCausalLM()
    original = list(model.state_dict().keys())
    wrapped = wrap_like_the_seed(model, args.emulate)
    wrapped_keys = list(wrapped.state_dict().keys())
    printout = repr(wrapped)
    legacy = list(original_unwrap_model(wrapped).state_dict().keys())
    recursive = list(recursive_unwrap(wrapped).state_dict().keys())  # mutates `wrapped`
    source = "emulated"
    if not args.emulate:
        import torch_xla
        source = "torch_xla " + getattr(torch_xla, "__version__", "?")
    with open(args.out, "w") as f:
        json.dump({"source": source, "torch_version": torch.__version__, "fixture": "tiny-gemma",
                   "printout": printout,
                   "original": original, "wrapped": wrapped_keys, "legacy": legacy,
                   "recursive": recursive}, f, indent=1)


if __name__ == "__main__":
    main()
