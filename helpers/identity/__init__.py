"""Notebook 01: caches rebuilt from the original K/V against the original. tables: the metadata and first-step logit
tables; decisions: the claims; finding: its declaration."""
