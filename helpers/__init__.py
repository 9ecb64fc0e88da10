"""Helpers behind the KV-cache resume reproduction notebooks.

The notebooks tell the story; these modules do the work. The resume library they measure is the `kvresume` package
(packages/kvresume, installed beside the kit); release-specific differences of transformers live in `kvresume.compat`.
"""
import importlib.util
import sys
from pathlib import Path

# kvresume installed (make env, the Colab cell, pip install packages/kvresume) is used as it is; a checkout on
# PYTHONPATH alone (gpu-check, the release venvs) finds the package beside it. Nothing is imported here.
if importlib.util.find_spec("kvresume") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages" / "kvresume"))
