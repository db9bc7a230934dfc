"""The core floor: facts and probes every other floor may use.

Measurement protocol (``measure``), datasheet peaks (``specs``) kept apart from what this machine
measured (``ceilings``), NVML state (``system``), topology, recorded evidence (``evidence``,
``store``), profiler kernel classes (``profiling``), communication probes (``comms``), the rank-tail
split (``tails``), the startup capture and step log for real jobs (``capture``, ``steplog``).
Nothing here imports a lab, a diagnosis module or the CLI.
"""
