"""The machinery that runs the notebooks (runner, run record, report, release matrix, output paths).

Notebooks do not import from here except `paths.output_dir`; see :mod:`helpers` for what they use.
"""
