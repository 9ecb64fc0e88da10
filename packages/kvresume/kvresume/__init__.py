"""kvresume: resume transformers generation from a reused KV cache without going silently wrong.

`track(model)` records a token ledger on every cache the model writes (which token, position and mask bit each slot
holds); `resume(model, input_ids, cache, ...)` reuses the longest cached common prefix of a whole conversation and
feeds the rest; `check_resume_inputs` / `guarded_generate` refuse, before the first model call, a `generate()` call
that would resume a cache wrongly (`ResumeInputError`: the cause and what to pass instead). The factory
(`kv_cache_from_tensors`, `export_tensors`) rebuilds a cache from tensors, validated; `state` saves and restores a
resume state (K/V, processed length, the model-side `rope_deltas`). Needs torch and transformers only.
"""
from . import state
from .checks import CHECKS, Check, ResumeInputError
from .factory import FactoryError, export_tensors, kv_cache_from_tensors
from .guard import check_forward_call, check_resume_inputs, guarded_generate
from .ledger import Ledger, keep_slots, ledger_of
from .reuse import resume, resume_report
from .state import ResumeState, ResumeStateError
from .tracking import track

__version__ = "0.2.0"
__all__ = ["CHECKS", "Check", "FactoryError", "Ledger", "ResumeInputError", "ResumeState", "ResumeStateError",
           "check_forward_call", "check_resume_inputs", "export_tensors", "guarded_generate", "keep_slots",
           "kv_cache_from_tensors", "ledger_of", "resume", "resume_report", "state", "track"]
