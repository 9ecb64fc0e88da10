"""Notebook 02: the cache-variant x generation-variant mask/position matrix and what the first model call receives.
tables: the matrix, the forward() quirk and their grids; decisions: the claims; finding: its declaration."""
