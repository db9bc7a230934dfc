"""Small helpers the notebooks share: where results come from, and plots in hardware units.

Everything a notebook shows is either *live* (measured now on this machine, GPU or CPU)
or *recorded* (from :mod:`hwlab.evidence`); :func:`banner` prints which, every time.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .measure import Measurement


def has_gpu() -> bool:
    return torch.cuda.is_available()


def banner(text: str, source: str) -> None:
    """Print a header that says where the numbers below come from."""
    from IPython.display import Markdown, display

    display(Markdown(f"**{text}** — _{source}_"))


def live_label() -> str:
    from .measure import device_name, device_of

    dev = device_of()
    kind = "GPU" if dev.type == "cuda" else "CPU (Triton interpreter / torch CPU; not GPU speed)"
    return f"measured live on {device_name(dev)}, {kind}"


def plot_gbps(ms: Iterable[Measurement], ceiling_gbps: float, title: str, source: str,
              moved: dict[str, int] | None = None, ax=None):
    """Bars of achieved GB/s (required bytes, and bytes moved where known) vs the ceiling."""
    import matplotlib.pyplot as plt

    ms = list(ms)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    names = [m.name for m in ms]
    req = [m.gbps for m in ms]
    ax.bar(names, req, label="GB/s of required bytes")
    if moved:
        mv = [moved.get(m.name, m.n_bytes) / (m.t_ms * 1e-3) / 1e9 for m in ms]
        ax.scatter(names, mv, marker="_", s=600, color="k", zorder=3, label="GB/s of bytes moved")
    ax.axhline(ceiling_gbps, ls="--", color="r", label=f"measured copy {ceiling_gbps:,.0f} GB/s")
    ax.set_ylabel("GB/s")
    ax.set_title(f"{title}\n({source})", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def show_mermaid(src: str) -> None:
    """Render Mermaid in JupyterLab 4 (it draws ```mermaid blocks); plain text elsewhere."""
    from IPython.display import Markdown, display

    display(Markdown(f"```mermaid\n{src}\n```"))
