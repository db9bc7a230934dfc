"""The diagnosis floor: modules that consume evidence and give verdicts.

The flowchart and its walk (``flowchart``), node health baselines (``baseline``,
``baseline_compare``, ``doctor``), the incident record and per-rank job reports (``ranks``,
``ranks_traces``). Grading a learner lives a floor above, in ``hwlab.course``. They read what the core and the labs measure; they do
not import the CLI or notebooks.
"""
