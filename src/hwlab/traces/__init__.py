"""The traces floor: reading any profiler trace once, streamed.

The Chrome-trace / Kineto format as every PyTorch version and ROCm write it (``kineto``), host ops
and their device kernels joined (``trace_ops``), recorded input shapes turned into bytes and FLOPs
(``trace_shapes``), and the event timeline the notebooks draw (``trace_events``). It imports only
the core; the per-rank report (``diagnosis.ranks_traces``) and a trace walked on the flowchart
(``examine.from_trace``) build on it.
"""
