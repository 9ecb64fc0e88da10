"""Every notebook on several transformers releases: release environments (envs), the runner (run), what differs
(facts, kinds) and matrix.md (report). Called by `make matrix` through run/cli, and by bisect/ and tools/gpu_check."""
