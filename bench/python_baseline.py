#!/usr/bin/env python3
"""The Python baseline for wrapcert's benchmark report: the duck-typed recursive unwrap
(accelerate's extract_model_from_parallel(recursive=True)) on real PyTorch (Debian's
python3-torch), on the same layouts as the C++ benchmarks, on the meta device. Writes Google
Benchmark's JSON format so tools/bench_report.py and tools/bench_compare.py read it as they read
the C++ runs.

The unwrap is the project's re-creation of accelerate's `_recursive_unwrap` (the `recursive=True`
branch: `hasattr(m, "module")`, then every child through `setattr`, in place), in
tools/tpu_bridge/seed_unwrap.py; accelerate itself is not imported. The wrapper is a stand-in
for torch_xla's SpmdFullyShardedDataParallel (`_orig_module`, with `module` a property
aliasing it). Each repetition times one unwrap of a freshly built tree (the unwrap rewires what
it is given), with time.perf_counter_ns.

    /usr/bin/python3 bench/python_baseline.py --out python.json [--repetitions 9]
        [--sizes 100,1000,10000,60000,100000]
"""
import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.nn as nn

# The same stand-in wrapper and the same recursive unwrap as the TPU bridge script.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "tpu_bridge"))
from seed_unwrap import EmulatedSpmdFullyShardedDataParallel as SpmdFullyShardedDataParallel  # noqa: E402
from seed_unwrap import recursive_unwrap  # noqa: E402

LAYOUTS = {  # name: (vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, tied, prefix)
    "gemma-2b": (256000, 2048, 16384, 18, 8, 1, 256, True, "Gemma"),
    "mistral-7b": (32000, 4096, 14336, 32, 32, 8, 128, False, "Mistral"),
}


def linear(i, o):
    return nn.Linear(i, o, bias=False, device="meta")


def causal_lm(name):
    vocab, hidden, inter, layers, heads, kv, hd, tied, _ = LAYOUTS[name]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj = linear(hidden, heads * hd), linear(hidden, kv * hd)
            self.v_proj, self.o_proj = linear(hidden, kv * hd), linear(heads * hd, hidden)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = linear(hidden, inter), linear(hidden, inter)
            self.down_proj = linear(inter, hidden)

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(hidden, device="meta"))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attention(), MLP()
            self.input_layernorm, self.post_attention_layernorm = Norm(), Norm()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden, device="meta")
            self.layers = nn.ModuleList([DecoderLayer() for _ in range(layers)])
            self.norm = Norm()

    class ForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = linear(hidden, vocab)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    return ForCausalLM(), DecoderLayer


class Node(nn.Module):
    pass


def seed_wrapped(name):
    model, layer_cls = causal_lm(name)
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = SpmdFullyShardedDataParallel(layer)
    return SpmdFullyShardedDataParallel(model)


def synthetic_tree(n):
    """As the C++ benchmark's: 4 children per node, every 8th a Linear leaf, every 4th wrapped."""
    root = Node()
    frontier, count, i = [root], 1, 0
    while count < n and i < len(frontier):
        parent = frontier[i]
        i += 1
        for c in range(4):
            if count >= n:
                break
            leaf = count % 8 == 0
            child = linear(1, 1) if leaf else Node()
            if not leaf:
                frontier.append(child)
            if count % 4 == 0:
                child = SpmdFullyShardedDataParallel(child)
            parent.add_module(str(c), child)
            count += 1
    return root


def measure(build, repetitions):
    """(wall ns, CPU ns of this thread) of one unwrap, per repetition."""
    times = []
    for _ in range(repetitions):
        model = build()  # the unwrap rewires what it is given: a fresh model each time
        cpu, start = time.thread_time_ns(), time.perf_counter_ns()
        recursive_unwrap(model)
        times.append((time.perf_counter_ns() - start, time.thread_time_ns() - cpu))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--sizes", default="100,1000,10000,60000,100000",
                        help="synthetic tree sizes, comma-separated (modules)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",") if n]
    load_at_start = list(os.getloadavg())
    cases = [("BM_PythonDuckTypedLayout/layout:0", lambda: seed_wrapped("gemma-2b")),
             ("BM_PythonDuckTypedLayout/layout:1", lambda: seed_wrapped("mistral-7b"))]
    for n in sizes:
        cases.append((f"BM_PythonDuckTyped/modules:{n}", lambda n=n: synthetic_tree(n)))
    benchmarks = []
    for name, build in cases:
        for rep, (wall, cpu) in enumerate(measure(build, args.repetitions)):
            benchmarks.append({"name": name, "run_name": name, "run_type": "iteration",
                               "repetitions": args.repetitions, "repetition_index": rep,
                               "iterations": 1, "real_time": wall, "cpu_time": cpu,
                               "time_unit": "ns"})
    context = {"python": platform.python_version(), "python_executable": sys.executable,
               "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
               "host_name": platform.node(), "executable": "python_baseline.py",
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "load_avg": load_at_start, "load_avg_at_end": list(os.getloadavg()),
               "num_cpus": os.cpu_count(),
               "unwrap": "accelerate's _recursive_unwrap (extract_model_from_parallel, "
                         "recursive=True), re-created in tools/tpu_bridge/seed_unwrap.py",
               "wrapper": "stand-in for torch_xla's SpmdFullyShardedDataParallel"}
    with open(args.out, "w") as f:
        json.dump({"context": context, "benchmarks": benchmarks}, f, indent=1)


if __name__ == "__main__":
    main()
