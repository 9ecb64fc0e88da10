"""Helpers behind the KV-cache resume reproduction notebooks.

The notebooks tell the story; these modules do the work. Release-specific differences of
transformers live in :mod:`helpers.compat` only.
"""
__version__ = "0.1.0"
