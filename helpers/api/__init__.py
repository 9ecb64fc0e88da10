"""The control's proposed resume API, prototyped: a validated K/V factory, a resume guard, a guarded generate()."""
from .checks import CHECKS, Check, ResumeInputError
from .factory import FactoryError, export_tensors, kv_cache_from_tensors
from .guard import check_forward_call, check_resume_inputs, guarded_generate

__all__ = ["CHECKS", "Check", "FactoryError", "ResumeInputError", "check_forward_call", "check_resume_inputs",
           "export_tensors", "guarded_generate", "kv_cache_from_tensors"]
