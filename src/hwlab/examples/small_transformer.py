"""A small GPT-style transformer written the way model code is written (embedding, layer norm,
attention through SDPA, an MLP whose GELU is spelled out op by op, a KV cache that grows by
concatenation), to examine as a whole model rather than one kernel. No dependency beyond torch.

Three factories for ``hwlab examine --model`` (each returns ``(module, inputs)``):

* ``model``: the full forward over a batch of token ids, GELU op by op (a mixed model: GEMMs,
  attention, an unfused elementwise chain, a gather for the embedding);
* ``model_fused``: the same weights with the one-kernel ``F.gelu(approximate="tanh")``, the fix
  the op-by-op version's parts point at;
* ``decode``: one decode step (a single new token per sequence, attending to a KV cache of past
  keys and values, which it extends with ``torch.cat``, as many model libraries do).

    hwlab examine examples/small_transformer.py:model --model
    hwlab examine examples/small_transformer.py:decode --model --out runs/decode.json
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu_op_by_op(x):
    """GELU (tanh form) as eight separate elementwise ops: eight passes over the activations."""
    inner = x + 0.044715 * torch.pow(x, 3)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * inner))


class Block(nn.Module):
    def __init__(self, d, n_heads, fused):
        super().__init__()
        self.n_heads, self.fused = n_heads, fused
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def _heads(self, t):
        b, s, d = t.shape
        return t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)

    def mlp(self, x):
        h = self.up(self.ln2(x))
        h = F.gelu(h, approximate="tanh") if self.fused else gelu_op_by_op(h)
        return self.down(h)

    def forward(self, x, past=None):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if past is not None:  # decode: extend the cache by concatenation
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(x), (k, v)


class TinyGPT(nn.Module):
    def __init__(self, vocab=4096, d=256, n_layers=2, n_heads=4, fused=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, fused) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x, _ = blk(x)
        return self.ln_f(x)

    def decode_step(self, idx, *cache):
        """One new token per sequence (``idx`` of shape (batch, 1)) against ``cache``: a key and a
        value tensor per layer. Returns the hidden state and the extended cache (new tensors;
        the inputs are left as they were)."""
        x = self.emb(idx)
        new = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, (cache[2 * i], cache[2 * i + 1]))
            new += list(kv)
        return (self.ln_f(x), *new)


def _config():
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32
    size = dict(vocab=32768, d=1024, n_layers=4, n_heads=16) if gpu else dict(vocab=512, d=64, n_layers=2, n_heads=4)
    batch, seq, past = (32, 256, 1024) if gpu else (2, 16, 32)
    return dev, dtype, size, batch, seq, past


def _build(fused):
    dev, dtype, size, batch, seq, _ = _config()
    torch.manual_seed(0)
    m = TinyGPT(fused=fused, **size).to(dev, dtype)
    return m, lambda: (torch.randint(0, size["vocab"], (batch, seq), device=dev),)


def model():
    """The full forward, GELU op by op."""
    return _build(False)


def model_fused():
    """The full forward with the one-kernel GELU (same weights: same seed)."""
    return _build(True)


def decode():
    """One decode step against a KV cache of ``past`` positions per layer."""
    dev, dtype, size, batch, _, past = _config()
    torch.manual_seed(0)
    m = TinyGPT(fused=False, **size).to(dev, dtype)
    h = size["d"] // size["n_heads"]

    def inputs():
        cache = [torch.randn(batch, size["n_heads"], past, h, device=dev, dtype=dtype)
                 for _ in range(2 * size["n_layers"])]
        return (torch.randint(0, size["vocab"], (batch, 1), device=dev), *cache)

    return m.decode_step, inputs


def gpt2_small():
    """GPT-2 small's shape (12 layers, 768 wide, 12 heads, its 50257-token vocabulary; random weights,
    GELU op by op) over one sequence of 128 tokens on a CPU (8 of 1024 on a GPU): a model of GPT-2's
    size with no dependency beyond torch, for timing an examination (``tools/bench_examine.py``)."""
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    m = TinyGPT(vocab=50257, d=768, n_layers=12, n_heads=12).to(dev)
    batch, seq = (8, 1024) if gpu else (1, 128)
    return m, lambda: (torch.randint(0, 50257, (batch, seq), device=dev),)
