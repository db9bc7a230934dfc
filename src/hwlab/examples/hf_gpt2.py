"""Optional: a GPT-2-shaped model from the ``transformers`` library (random weights, nothing
downloaded), for users of that library. Skipped where ``transformers`` is not installed.

    hwlab examine examples/hf_gpt2.py:model --model
"""
import torch


def model():
    from transformers import GPT2Config, GPT2Model  # optional dependency: ImportError if absent

    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    cfg = GPT2Config(n_embd=768 if gpu else 64, n_layer=4 if gpu else 2, n_head=12 if gpu else 4,
                     vocab_size=8192 if gpu else 512, n_positions=1024)
    torch.manual_seed(0)
    m = GPT2Model(cfg).to(dev, torch.bfloat16 if gpu else torch.float32)
    batch, seq = (16, 256) if gpu else (2, 16)

    def inputs():
        return (torch.randint(0, cfg.vocab_size, (batch, seq), device=dev),)

    return m, inputs
