"""Notebook 09: a new image in the second turn of a Qwen3-VL chat resumed from the first turn's cache.

turns (the two-turn prompt, the reference, the turn-1 cache), shapes (the call shapes people write, each run and
measured, with what reached their first model call), repair (positions from the model's own
get_rope_index, resumed at), decisions (the verdicts), tables (the tables and the positions figure).
"""
