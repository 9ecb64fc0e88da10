"""Notebook 10: rolling a cache back (crop), multi-token continuation on the hybrid, and 5.25.0's rebuild change.

`setup` builds the families (dense, sliding, static, hybrid) and their prompts, `probes` measures a to e (comparing
two caches by what they hold: K/V, conv and recurrent states, the reported length), `decisions` turns the
measurements into verdicts against a noise floor measured in the same run.
"""
