# wrapcert's causal-LM fixtures (the Gemma and Mistral layouts) in plain PyTorch, built from the
# configuration the C++ side sends, so both sides build one layout from one set of numbers: the
# same module classes, names and registration order, hence the same state-dict keys (checked
# on every run). The forward pass is a compact Llama-style decoder, enough for gradients to
# reach every parameter.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, one_plus):
        super().__init__()
        self.eps, self.one_plus = eps, one_plus
        self.weight = nn.Parameter(torch.zeros(dim) if one_plus else torch.ones(dim))

    def forward(self, x):
        scale = (1.0 + self.weight) if self.one_plus else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * scale


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).double() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, seq_len):
        t = torch.arange(seq_len, dtype=self.inv_freq.dtype)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(x.dtype)
        return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.rotary_emb = RotaryEmbedding(self.head_dim, c["rope_theta"])

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary_emb(x, n)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, c, gemma):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = nn.GELU(approximate="tanh") if gemma else nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c, gemma):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c, gemma)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], gemma)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], gemma)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, c, gemma):
        super().__init__()
        self.gemma, self.hidden = gemma, c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"],
                                         padding_idx=c.get("pad_token_id"))
        self.layers = nn.ModuleList([DecoderLayer(c, gemma) for _ in range(c["num_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], gemma)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        if self.gemma:
            x = x * math.sqrt(self.hidden)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        gemma = c["architecture"] == "gemma"
        self.model = Model(c, gemma)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        return self.lm_head(self.model(ids))


def build(config):
    """The fixture, with its decoder layers' paths (where auto-wrap policies wrap)."""
    model = CausalLM(config)
    return model, [f"model.layers.{i}" for i in range(config["num_layers"])]
