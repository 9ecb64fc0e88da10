"""The control's proposed resume API, prototyped: a validated K/V factory, a resume guard, a guarded generate()."""
from .factory import FactoryError, export_tensors, kv_cache_from_tensors
from .guard import ResumeInputError, check_resume_inputs, guarded_generate

__all__ = ["FactoryError", "ResumeInputError", "check_resume_inputs", "export_tensors", "guarded_generate",
           "kv_cache_from_tensors"]
