"""PyTorch's encoder fast path: a ``torch.nn.TransformerEncoder`` in eval mode under ``no_grad`` runs
each layer as one native op (``aten::_transformer_encoder_layer_fwd``) whose kernels are GEMMs,
attention and elementwise work. ``hwlab examine`` should split it into those parts, not read the
one op as elementwise.

    hwlab examine examples/encoder_fastpath.py:model --model
"""
import torch


def model():
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    d, heads, ff, layers = (768, 12, 3072, 6) if gpu else (128, 4, 512, 2)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, ff, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev).eval()
    for p in enc.parameters():
        p.requires_grad_(False)  # the fast path needs no autograd on the weights
    batch, seq = (16, 512) if gpu else (2, 64)
    return enc, lambda: (torch.randn(batch, seq, d, device=dev),)
