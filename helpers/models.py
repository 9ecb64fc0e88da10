"""Model loading: the seeded tiny defaults (built from kvresume.testing's configs, nothing downloaded; every tiny model
the kit and its tests build comes from here) and real checkpoints.

`load()` is the one entry point notebooks use. A real checkpoint name goes through
`from_pretrained`; offline it fails fast with one clear `ModelUnavailableError`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlparse

import torch
from huggingface_hub import try_to_load_from_cache
from kvresume import testing
from kvresume.compat import image_processor_class
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer,
                          LlamaForCausalLM, Qwen3_5ForCausalLM)

from .pipeline.run.params import DTYPE_ALIASES
from .processor import load_processor

TINY_VL = "tiny-qwen3-vl"
TINY_HYBRID = "tiny-qwen3.5-hybrid"
TINY_DENSE = "tiny-qwen3"  # text-only, full attention everywhere
TINY_SLIDING = "tiny-qwen3-sliding"  # text-only, sliding/full attention layers interleaved
SLIDING_WINDOW = 16  # the tiny sliding default's window (the probe: window 16)

# Token ids of the tiny Qwen3-VL (its vocabulary is synthetic).
TINY_VL_TOKENS = {"image": 2000, "video": 2001, "vision_start": 2002, "vision_end": 2003}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
# Files that make a local folder's identity: its config and its weights.
IDENTITY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


class ModelUnavailableError(RuntimeError):
    """A model_id that cannot be loaded here; the message names the offline default."""


@dataclass
class ModelBundle:
    """A loaded model with what the notebooks need to know about it."""

    model: torch.nn.Module
    model_id: str
    revision: str | None
    dtype: torch.dtype
    attn_implementation: str
    device: str
    seed: int
    is_multimodal: bool
    processor: Any = None  # image processor (tiny), AutoProcessor or its fallback (real multimodal)
    tokenizer: Any = None  # None for the tiny models: their token ids are synthetic
    build: Callable[[], torch.nn.Module] | None = field(default=None, repr=False)
    processor_path: str | None = None  # which path built `processor` (shown in the environment)

    @property
    def is_tiny(self) -> bool:
        return self.model_id.startswith("tiny-")

    def fresh_instance(self) -> torch.nn.Module:
        """A second model instance with the same weights and no model-side state from earlier calls."""
        return self.build()

    def environment(self) -> dict[str, Any]:
        device_name = torch.cuda.get_device_name(0) if self.device.startswith("cuda") else None
        return {
            "device": self.device,
            "device_name": device_name or "cpu",
            "dtype": str(self.dtype).replace("torch.", ""),
            "attn_implementation": self.attn_implementation,
            "model_id": public_model_id(self.model_id),
            "model_revision": self.revision or ("built from config (random weights)" if self.is_tiny else "main"),
            "processor": self.processor_path,
            "seed": self.seed,
        }


def public_model_id(model_id: str) -> str:
    """A hub id as it is; a local folder by its name only (no machine path in shared outputs)."""
    return os.path.basename(os.path.normpath(model_id)) if os.path.isdir(model_id) else model_id


def local_folder_revision(folder: str) -> str:
    """'local folder <name>, sha256:<12 hex>' over the folder's config.json and weight files (names and bytes)."""
    digest = hashlib.sha256()
    names = sorted(n for n in os.listdir(folder) if n == "config.json" or n.endswith(IDENTITY_SUFFIXES))
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(os.path.join(folder, name), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return f"local folder {public_model_id(folder)}, sha256:{digest.hexdigest()[:12]}"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float16' / 'fp16' / torch.float16 -> torch.float16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, DTYPE_ALIASES.get(dtype, dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def _seeded(seed: int, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make().eval()


def tiny_image_processor() -> Any:
    """The real Qwen-VL image processor class, constructed locally with Qwen3-VL's patch settings."""
    return image_processor_class()(patch_size=16, temporal_patch_size=2, merge_size=2,
                                   image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def build_tiny_qwen3(seed: int = 0, attn_implementation: str = "sdpa", sliding_window: int | None = None) -> torch.nn.Module:
    """kvresume.testing's seeded tiny text-only Qwen3 (hidden 64, 4 layers, vocabulary 2048): dense, or with
    `sliding_window` (SLIDING_WINDOW) sliding/full layers interleaved (transformers builds `DynamicSlidingWindowLayer`s)."""
    if sliding_window not in (None, SLIDING_WINDOW):
        raise ValueError(f"the tiny sliding Qwen3 has window {SLIDING_WINDOW}")
    return testing.build("dense" if sliding_window is None else "sliding", attn_implementation, seed)


def build_tiny_hybrid(seed: int = 0, attn_implementation: str = "sdpa", layer_types: list[str] | None = None) -> torch.nn.Module:
    """The seeded tiny Qwen3.5 hybrid of kvresume.testing (8 layers, 3 linear : 1 full, hidden 64) with a context of
    8192; `layer_types` (its length sets the depth) replaces the 3:1 pattern (helpers.hybrid.LAYOUTS)."""
    layout = {} if layer_types is None else {"layer_types": list(layer_types), "num_hidden_layers": len(layer_types)}
    config = testing.text_config("hybrid", attn_implementation, max_position_embeddings=8192, **layout)
    return _seeded(seed, lambda: Qwen3_5ForCausalLM(config))


def tiny_llama(seed: int = 0, attn: str = "sdpa", layers: int = 2) -> torch.nn.Module:
    """The seeded tiny Llama of kvresume.testing with padding id 0 (notebook 08)."""
    config = testing.llama_config(attn, num_hidden_layers=layers, pad_token_id=0)
    return _seeded(seed, lambda: LlamaForCausalLM(config))


# The tiny defaults: kvresume.testing's model of each kind (the seeded weights), the hybrid with an 8192 context.
TINY_MODELS: dict[str, Callable[[int, str], torch.nn.Module]] = {
    TINY_VL: lambda seed, attn: testing.build("multimodal", attn, seed),
    TINY_HYBRID: lambda seed, attn: build_tiny_hybrid(seed, attn),
    TINY_DENSE: lambda seed, attn: testing.build("dense", attn, seed),
    TINY_SLIDING: lambda seed, attn: testing.build("sliding", attn, seed),
}


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub answers a TCP connect within `timeout` seconds (and offline mode is off)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _unavailable(model_id: str, why: str) -> ModelUnavailableError:
    tiny = ", ".join(f"'{name}'" for name in TINY_MODELS)
    return ModelUnavailableError(
        f"cannot load model_id='{public_model_id(model_id)}': {why}. Offline, use a tiny default built from a config "
        f"({tiny}); real checkpoints need the model hub (for example in Colab)."
    )


def pretrained_model(model_id: str, revision: str | None, dtype: torch.dtype, attn_implementation: str,
                     device: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """A real checkpoint (image-text-to-text where its config has a vision part), or ModelUnavailableError."""
    if not (os.path.isdir(model_id)
            or isinstance(try_to_load_from_cache(model_id, "config.json", revision=revision), str) or hub_reachable()):
        raise _unavailable(model_id, "the model hub is not reachable from this machine and it is not in the local cache")
    try:
        config = AutoConfig.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - one clear message instead of the hub client's traceback
        raise _unavailable(model_id, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = cls.from_pretrained(model_id, dtype=dtype, attn_implementation=attn_implementation, revision=revision,
                                trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def text_side(model_id: str, revision: str | None, is_multimodal: bool,
              trust_remote_code: bool = False) -> tuple[Any, Any, str]:
    """(processor, tokenizer, which path built them) of a real checkpoint."""
    if os.path.isdir(model_id) and not any(os.path.exists(os.path.join(model_id, f)) for f in TOKENIZER_FILES):
        # A local directory saved without tokenizer files (as in the tests) gets synthetic token ids.
        why = "none: no tokenizer files (synthetic token ids"
        if is_multimodal:
            return tiny_image_processor(), None, why + ", tiny default's image processor)"
        return None, None, why + ")"
    if is_multimodal:
        processor, path = load_processor(model_id, revision, trust_remote_code)
        return processor, getattr(processor, "tokenizer", processor), path
    tokenizer = AutoTokenizer.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    return None, tokenizer, "AutoTokenizer"


def load(model_id: str = TINY_VL, revision: str | None = None, dtype: str | torch.dtype = "float32",
         attn_implementation: str = "sdpa", device: str = "cpu", seed: int = 0,
         trust_remote_code: bool = False) -> ModelBundle:
    """Load a tiny default or a real checkpoint into a ModelBundle."""
    torch_dtype = resolve_dtype(dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if model_id in TINY_MODELS:
        def build() -> torch.nn.Module:
            return TINY_MODELS[model_id](seed, attn_implementation).to(device=device, dtype=torch_dtype).eval()

        processor = tiny_image_processor() if model_id == TINY_VL else None
        return ModelBundle(build(), model_id, None, torch_dtype, attn_implementation, device, seed, model_id == TINY_VL,
                           processor=processor, build=build,
                           processor_path=f"{type(processor).__name__} (synthetic token ids)" if processor else None)
    if model_id.startswith("tiny-"):
        raise _unavailable(model_id, "no tiny model of that name")
    torch.manual_seed(seed)
    build_real = functools.partial(pretrained_model, model_id, revision, torch_dtype, attn_implementation, device,
                                   trust_remote_code)
    model = build_real()
    is_multimodal = hasattr(model.config, "vision_config")
    processor, tokenizer, path = text_side(model_id, revision, is_multimodal, trust_remote_code)
    # A local folder is named by its content hash; a hub checkpoint by the commit it resolved to.
    identity = local_folder_revision(model_id) if os.path.isdir(model_id) else (
        revision or getattr(model.config, "_commit_hash", None))
    return ModelBundle(model, model_id, identity, torch_dtype, attn_implementation, device, seed, is_multimodal,
                       processor=processor, tokenizer=tokenizer, build=build_real, processor_path=path)
