"""Notebook 05 (transformers issue #48947): DynamicCache offloading on a hybrid model.

loops: the greedy loops and comparisons; schedule: the offload/prefetch recorder; streams: the stream model;
tracking: copies entered into the stream log, the 5.20.0 edge; replay: the race replay (a simulation);
gpu: the CUDA experiment; source: the installed source; plots: the figures.
"""
