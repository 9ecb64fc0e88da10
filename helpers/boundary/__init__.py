"""Notebook 04: the token boundary (a valid split against a token processed twice). splits: the continuations of both splits, their
table and the re-feed rate; decisions: the claims; finding: its declaration."""
