"""Headless notebook runs: the command line (cli), one notebook (execute), a recorded run (batch), warm kernels,
process control, parameter checks and the run record. Called by `make run-all`/`run`/`report` (python -m helpers.pipeline.run)."""
