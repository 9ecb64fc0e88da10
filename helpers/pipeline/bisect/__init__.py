"""`make bisect`: the first release where a claim's verdict or a recorded value changes (search), the relevant
transformers source diff (source), outputs/bisect/ (report). Called by the Makefile: python -m helpers.pipeline.bisect."""
