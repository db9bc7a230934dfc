"""The diagnosis floor: modules that consume evidence and give verdicts.

The flowchart and its walk (``flowchart``), node health baselines (``baseline``,
``baseline_compare``, ``doctor``), drills and exercise checks, the incident record, per-rank job
reports (``ranks``) and the class record. They read what the core and the labs measure; they do
not import the CLI or notebooks.
"""
