"""Notebook 05 (transformers issue #48947): DynamicCache offloading on a hybrid model.

loops: the greedy loops (generate()'s host waits recorded) and comparisons; schedule: the offload/prefetch recorder;
streams: the stream model; standins: its recording stand-ins for the CUDA stream API (with a modelled device
timeline); tracking: copies entered into the stream log, the fix edges; ordering and hazards: the loops x models table
and the second hazard; replay: the race replay (a simulation); gpu: the GPU arms and the plain module
`python -m helpers.offload.gpu` (the claims; the claim comparing releases, `make gpu-check`), built from gpu_run
(what runs, the runs), arms (one run, the poisoned pinned pool), states (snapshots, comparisons), calibrate (the
device lag, the event-wait probe, CUDA events around every copy) and gpu_decide (the decisions);
signature: the report's signature; source: the installed source; plots: the figures.
"""
