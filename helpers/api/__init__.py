"""The control's proposed resume API, prototyped: a validated K/V factory, a resume guard, a guarded generate(), a token
ledger recorded by `track(model)` that the guard reads, and the prefix-aware `resume`."""
from .checks import CHECKS, Check, ResumeInputError
from .factory import FactoryError, export_tensors, kv_cache_from_tensors
from .guard import check_forward_call, check_resume_inputs, guarded_generate
from .ledger import Ledger, keep_slots, ledger_of
from .reuse import resume
from .tracking import track

__all__ = ["CHECKS", "Check", "FactoryError", "Ledger", "ResumeInputError", "check_forward_call", "check_resume_inputs",
           "export_tensors", "guarded_generate", "keep_slots", "kv_cache_from_tensors", "ledger_of", "resume", "track"]
