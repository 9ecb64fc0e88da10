"""Parameters checked before a kernel starts: each notebook's `parameters` cell is read (ast, no
kernel), and a bad `-p NAME VALUE` is refused in one line naming what is valid.

Cheap on purpose (well under 2 s): no torch, no transformers import. CUDA is judged from the
installed torch build (torch/version.py) and the driver's device files; attention implementations
are read from transformers' AttentionInterface registry in its source file.
"""
from __future__ import annotations

import ast
import json
import os
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

# Smallest meaningful value of an integer parameter, by name (any notebook that declares it).
MINIMUMS: dict[str, tuple[int, str]] = {
    "seq_len": (2, "a prefix and at least one token to resume from"),
    "n_steps": (2, "the prefill and at least one decode step"),
    "batch_size": (1, "at least one sequence"),
    "seed": (0, "torch seeds are non-negative"),
}
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}
DTYPES = ("float32", "float16", "bfloat16", "float64")
NOT_LITERAL = object()  # a default the cell computes (e.g. list(range(...))): any value is accepted
# generate_kwargs: what the controls set themselves (refused), and generate()'s own arguments beside GenerationConfig's
RESERVED_GENERATE = ("input_ids", "attention_mask", "position_ids", "past_key_values", "max_new_tokens",
                     "return_dict_in_generate", "output_logits", "generation_config")
GENERATE_ARGUMENTS = ("use_cache", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "synced_gpus",
                      "assistant_model", "streamer", "negative_prompt_ids", "negative_prompt_attention_mask",
                      "custom_generate", "tokenizer", "logits_to_keep")


class ParameterError(ValueError):
    """A parameter refused before any kernel starts; str() is the one line shown to the user."""


def parameters_source(path: Path) -> str:
    """The source of the notebook's cell tagged `parameters` ("" when it has none)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    cells = [c for c in nb.get("cells", []) if "parameters" in (c.get("metadata", {}).get("tags") or [])]
    source = cells[0]["source"] if cells else ""
    return "".join(source) if isinstance(source, list) else source


def declared(path: Path) -> dict[str, Any]:
    """{name: default} of the notebook's cell tagged `parameters` (NOT_LITERAL where it is computed)."""
    out: dict[str, Any] = {}
    for node in ast.parse(parameters_source(path)).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):  # every cell's form: name = value
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = NOT_LITERAL
    return out


CHOICE = re.compile(r"^(\w+)\s*=.*#\s*one of:\s*([\w.-]+(?:\|[\w.-]+)+)", re.MULTILINE)


def declared_choices(path: Path) -> dict[str, tuple[str, ...]]:
    """{name: valid values} of the parameters whose line in the `parameters` cell ends "# one of: a|b|c"."""
    return {m[1]: tuple(m[2].split("|")) for m in CHOICE.finditer(parameters_source(path))}


def _package_file(package: str, *parts: str) -> str:
    """The text of one file of an installed package, read without importing it ("" where it cannot be read)."""
    try:
        return Path(list(find_spec(package).submodule_search_locations)[0]).joinpath(*parts).read_text()  # type: ignore
    except (AttributeError, TypeError, OSError):
        return ""


def cuda_status() -> tuple[bool, str]:
    """(CUDA usable?, why not) without importing torch: a CUDA/ROCm build of torch and a driver device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False, "CUDA_VISIBLE_DEVICES hides every GPU"
    if find_spec("torch") is None:
        return False, "torch is not installed"
    text = _package_file("torch", "version.py")
    build = {k: v for k, v in re.findall(r"^(cuda|hip|__version__)\b[^=]*=\s*'([^']*)'", text, re.MULTILINE)}
    if not build.get("cuda") and not build.get("hip"):
        return False, f"torch {build.get('__version__', '?')} is a CPU-only build"
    devices = ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/nvidiactl") if build.get("cuda") else ("/dev/kfd",)
    if not any(os.path.exists(p) for p in devices):
        return False, "no GPU driver or device is present"
    return True, ""


def attention_implementations() -> list[str]:
    """"eager" plus the names registered in transformers' AttentionInterface, read from its source."""
    text = _package_file("transformers", "modeling_utils.py")
    found = re.search(r"class AttentionInterface\b.*?_global_mapping = \{([^}]*)\}", text, re.S)
    names = re.findall(r"""^\s*["']([^"']+)["']\s*:""", found[1] if found else "", re.MULTILINE)
    return ["eager", *dict.fromkeys(names)]


def generation_config_names() -> list[str]:
    """GenerationConfig's argument names, read from transformers' source (`kwargs.pop("name"` in its __init__)."""
    text = _package_file("transformers", "generation", "configuration_utils.py")
    return sorted(set(re.findall(r"""kwargs\.pop\(\s*["'](\w+)["']""", text)))


def check_generate_kwargs(value: Any, where: str = "") -> None:
    """A JSON object of generate() arguments the controls do not set themselves."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ParameterError(f"generate_kwargs{where} is not valid JSON ({exc.msg} at column {exc.colno}): {value!r}; "
                                 """pass an object, e.g. -p generate_kwargs '{"use_cache": true}'""") from None
    if not isinstance(value, dict):
        raise ParameterError(f"generate_kwargs={value!r}{where} must be a JSON object of generate() arguments")
    if clash := sorted(set(value) & set(RESERVED_GENERATE)):
        raise ParameterError(f"generate_kwargs{where} may not set {', '.join(clash)}: the controls set them "
                             "(the argument sets and one greedy step)")
    known = generation_config_names()
    if unknown := sorted(k for k in value if known and k not in known and k not in GENERATE_ARGUMENTS):
        raise ParameterError(f"generate_kwargs{where}: unknown generate() argument(s) {', '.join(map(repr, unknown))} "
                             "(neither a GenerationConfig field nor a generate() argument of this transformers)")


def resolve(path: str) -> Path:
    """A relative path from the working directory, else from the kit checkout (as for a rebuild's file)."""
    from ..paths import repo_root

    p = Path(path).expanduser()
    return p if p.is_file() or p.is_absolute() else repo_root() / p


def read_ids(path: str) -> list[int]:
    """Token ids from a JSON file: a list of ints, [[...]] (batch 1) or {"input_ids": ...}; ValueError otherwise."""
    data = json.loads(resolve(path).read_text())
    if isinstance(data, dict):
        data = data.get("input_ids")
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], list):
        data = data[0]
    if not (isinstance(data, list) and len(data) >= 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in data)):
        raise ValueError("expected a JSON list of at least 2 non-negative token ids (or {\"input_ids\": [...]})")
    return data


def _check_prompt_ids(value: Any, where: str) -> None:
    """A JSON file (tried from the working directory, then the kit checkout) holding at least 2 token ids."""
    if value in ("", None):
        return
    if not isinstance(value, str):
        raise ParameterError(f"prompt_ids={value!r}{where} must be the path of a JSON file of token ids")
    if not resolve(value).is_file():
        raise ParameterError(f"prompt_ids{where}: file {Path(value).name!r} does not exist "
                             "(relative paths are tried from the working directory, then the kit checkout)")
    try:
        read_ids(value)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParameterError(f"prompt_ids{where}: {Path(value).name} is not valid JSON ({exc})") from None
    except ValueError as exc:
        raise ParameterError(f"prompt_ids{where}: {Path(value).name}: {exc}") from None


def _check_value(name: str, value: Any, default: Any, where: str) -> None:
    """Refuse one value: wrong type, unknown dtype/device/attention, integer below its minimum."""
    if name == "dtype":
        if DTYPE_ALIASES.get(str(value), value) not in DTYPES:
            raise ParameterError(f"unknown dtype {value!r}; valid: {', '.join(DTYPES)} "
                                 f"(or {', '.join(DTYPE_ALIASES)})")
        return
    if name == "device":
        if not isinstance(value, str) or not re.fullmatch(r"cpu|auto|cuda(:\d+)?", value):
            raise ParameterError(f"unknown device {value!r}; valid: cpu, auto, cuda, cuda:<index>")
        if value.startswith("cuda"):
            ok, why = cuda_status()
            if not ok:
                raise ParameterError(f"device={value} needs CUDA, which is not available here ({why}); "
                                     "use -p device cpu or -p device auto")
        return
    if name == "attn_implementation":
        known = attention_implementations()
        if not (isinstance(value, str) and (value in known or "/" in value)):  # "org/repo": a Hub kernel
            raise ParameterError(f"unknown attn_implementation {value!r}; transformers knows: {', '.join(known)}")
        return
    own = {"generate_kwargs": check_generate_kwargs, "prompt_ids": _check_prompt_ids}
    if name in own:
        return own[name](value, where)
    if name == "trust_remote_code" and value is not False:
        raise ParameterError(f"trust_remote_code={value!r}: the kit runs with trust_remote_code off")
    kind = {bool: "true or false", int: "an integer", str: "text"}.get(type(default))  # NOT_LITERAL, None: any
    if kind and type(value) is not type(default):
        raise ParameterError(f"{name}={value!r}{where} must be {kind}")
    if name in MINIMUMS and isinstance(value, int) and value < MINIMUMS[name][0]:
        low, why = MINIMUMS[name]
        raise ParameterError(f"{name}={value}{where} is below its minimum {low} ({why})")


def check(notebooks: list[Path], given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{stem: the parameters that notebook declares, from `given`}; ParameterError on the first bad one.

    A name no selected notebook declares is refused (listing the known ones); a name only some declare
    goes to those.
    """
    decl = {nb.stem: declared(nb) for nb in notebooks}
    known = sorted({name for names in decl.values() for name in names})
    for name in given:
        if name not in known:
            raise ParameterError(f"unknown parameter {name!r}; the selected notebook(s) know: {', '.join(known)}")
    per_notebook: dict[str, dict[str, Any]] = {}
    for stem, names in decl.items():
        mine = {k: v for k, v in given.items() if k in names}
        choices = declared_choices(next(nb for nb in notebooks if nb.stem == stem))
        for name, value in mine.items():
            where = f" (notebook {stem})" if len(decl) > 1 else ""
            if name in choices and value not in choices[name]:
                raise ParameterError(f"unknown {name} {value!r}{where}; valid: {', '.join(choices[name])}")
            _check_value(name, value, names[name], where)
        if mine.get("prompt_text") and mine.get("prompt_ids"):
            raise ParameterError(f"prompt_text and prompt_ids given together (notebook {stem}): pass one of them")
        per_notebook[stem] = mine
    return per_notebook
