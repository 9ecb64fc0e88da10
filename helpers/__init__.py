"""Helpers behind the KV-cache resume reproduction notebooks.

The notebooks tell the story; these modules do the work. The resume library they measure is the `kvresume` package
(packages/kvresume, installed beside the kit); release-specific differences of transformers live in `kvresume.compat`.
"""
import sys
from pathlib import Path

try:
    import kvresume  # noqa: F401  (installed: make env, the Colab cell, pip install packages/kvresume)
except ModuleNotFoundError:  # a checkout on PYTHONPATH alone (gpu-check, the release venvs): the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packages" / "kvresume"))

__version__ = "0.1.0"
