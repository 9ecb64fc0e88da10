"""Notebook 03: Qwen3-VL's `rope_deltas` lives on the model, not in the cache. perturbation: the state's
perturbations and the fresh-instance branch; decisions: the claims; finding: its declaration."""
