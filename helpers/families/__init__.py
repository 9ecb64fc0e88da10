"""Notebook 07: the resume-contract control's regression list run across cache families.

setup: the five cache families (dense, multimodal, sliding-window, hybrid, left-padded batch); rebuilds: the
control's rebuild and the family-aware one; checks: the table's cells, measured; table: the table and its grid
figure; decisions: the claims, computed from the cells.
"""
