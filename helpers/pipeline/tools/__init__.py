"""Developer tools outside the notebook runs: `make gpu-check` (gpu_check), `make mutants` (mutants) and the Colab
cell and README badges (colab). Each is a command line called by the Makefile (python -m helpers.pipeline.tools.<name>)."""
