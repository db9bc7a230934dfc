"""The traces floor: reading any profiler trace once, streamed.

The file format read one event at a time, and which files are traces (``trace_stream``); what the
per-rank analysis keeps of a Chrome-trace / Kineto file as every PyTorch version (1.8's
"Operator"/"Kernel"/"Runtime" categories included) and ROCm write it (``kineto``); each rank's steps
on the device's clock and collectives matched across ranks (``rank_reading``); host ops and their
device kernels joined (``trace_ops``); recorded input shapes turned into bytes and FLOPs
(``trace_shapes``); and the event timeline the notebooks draw (``trace_events``). It imports only
the core; the per-rank report (``diagnosis.ranks_traces``) and a trace walked on the flowchart
(``examine.from_trace``) build on it.
"""
