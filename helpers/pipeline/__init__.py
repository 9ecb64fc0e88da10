"""The machinery that runs the notebooks: run/ (headless runs and their record), report/ (SUMMARY.md, HTML,
share.zip), matrix/ (releases), bisect/ (make bisect), tools/ (gpu-check, mutants, the Colab cell), paths.py.

Notebooks do not import from here except `paths.output_dir`; see :mod:`helpers` for what they use.
"""
