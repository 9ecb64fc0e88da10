"""The resume-contract control's decision tree as code: control outcomes in, a branch and its path out.

Everything here is pure: `Controls` holds the plain numbers the controls measured (see
`helpers.triage.run`), `choose_branch` walks the tree and records every decision with its numbers,
`render` prints the tree with the taken path marked (for pasting into a bug thread), and the
`decide_*` functions compute the notebook's claims. "Matches"/"differs" always means against the
`NoiseFloor` measured in the same run and dtype (`helpers.compare.noise_floor`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..compare import NoiseFloor
from .leaves import MEANING, NEXT  # noqa: F401 - the leaves' texts, re-exported

LEAVES = ("resume_contract", "model_side_state", "compression_positions", "compression_positions_and_loss",
          "compression_information_loss", "compression_unresolved", "reconstruction_copy", "cache_metadata", "unexplained")

# (node id, depth, question, leaf reached when the answer is yes)
NODES = (
    ("identical", 0, "original and rebuilt behave identically under identical arguments", None),
    ("fresh_state", 1, "same instance works, a fresh instance differs until the model-side state is restored",
     "model_side_state"),
    ("fails_for_both", 1, "what fails, fails for both; the full mask works for both", "resume_contract"),
    ("only_rebuilt", 0, "only the rebuilt cache differs", None),
    ("lengths_changed", 1, "the identity rebuild matches and this rebuild changes cache lengths", None),
    ("positions_shift", 2, "(a) generate() continues at a position other than the processed length, and the step at "
     "explicit logical positions changes the result beyond the floor (explicit_vs_generate)", None),
    ("positions_and_loss", 3, "(b) at the processed length the step still differs from the full forward "
     "(explicit_vs_full_forward)", "compression_positions_and_loss"),
    ("positions_restore", 3, "(b) at the processed length the step matches the full forward within the floor",
     "compression_positions"),
    ("information_lost", 2, "(a) no: generate() already continues at the processed length (its step matches the explicit "
     "one); (b) the step differs from the full forward (explicit_vs_full_forward)", "compression_information_loss"),
    ("unresolved", 2, "neither question answered: the explicit-position step did not run, or differs from generate()'s "
     "at the same position", "compression_unresolved"),
    ("kv_differ", 1, "its K/V tensors differ from the original's", "reconstruction_copy"),
    ("metadata_differ", 1, "K/V identical, layer classes or lengths differ", "cache_metadata"),
    ("state_restores", 1, "K/V and metadata match; restoring the model-side state makes it match", "model_side_state"),
    ("nothing_visible", 1, "K/V and visible cache metadata match", "unexplained"),
)
@dataclass
class ArgSet:
    """One argument set (the seed's neither/position_only/mask_only/both): both caches' outcomes."""

    name: str
    original_ok: bool
    rebuilt_ok: bool
    original_error: str = ""
    rebuilt_error: str = ""
    max_abs_diff: float | None = None  # rebuilt vs original first-step logits, when both ran


@dataclass
class Controls:
    """The plain numbers of every control for one rebuild (what `choose_branch` needs)."""

    rebuild: str
    floor: NoiseFloor
    arg_sets: list[ArgSet]
    processed_length: int
    original_lengths: list[int]
    rebuilt_lengths: list[int]
    classes_equal: bool
    kv_bitwise_equal: bool
    kv_max_abs_diff: float | None = None
    identity_identical: bool | None = None  # the identity control's first decision (None: not run)
    identity_worst: float | None = None
    state_changed: bool = False  # the rebuild changed the model-side state of the instance
    restored_diff: float | None = None  # same instance, state restored after the rebuild, vs original
    fresh_bare_diff: float | None = None  # fresh instance without the state vs same instance
    fresh_restored_diff: float | None = None  # fresh instance with the state restored vs same instance
    resume_on: str = "same_instance"
    extra: dict[str, Any] = field(default_factory=dict)  # positions, explicit-step numbers: shown, not branched on


def consistent(a: ArgSet, floor: NoiseFloor) -> bool:
    """Same status for both caches, same error type when both fail, logits within the floor when both ran."""
    if a.original_ok != a.rebuilt_ok:
        return False
    if not a.original_ok:
        return a.original_error == a.rebuilt_error
    return a.max_abs_diff is not None and floor.matches(a.max_abs_diff)


def identical(c: Controls) -> tuple[bool, dict[str, Any]]:
    """Decision 1 and its numbers: every argument set consistent between original and rebuilt."""
    per = {a.name: ("both failed (" + a.original_error + ")" if not (a.original_ok or a.rebuilt_ok) else
                    a.max_abs_diff if a.original_ok and a.rebuilt_ok else
                    f"original {'worked' if a.original_ok else 'failed'}, rebuilt {'worked' if a.rebuilt_ok else 'failed'}")
           for a in c.arg_sets}
    worst = max((a.max_abs_diff for a in c.arg_sets if a.max_abs_diff is not None), default=None)
    same = bool(c.arg_sets) and all(consistent(a, c.floor) for a in c.arg_sets)
    return same, {"per_argument_set": per, "worst_max_abs_diff": worst, "noise_threshold": c.floor.threshold}


def lengths_changed(c: Controls) -> bool:
    """Some layer holds a number of slots other than the processed length (eviction, per-layer budgets)."""
    return any(n is not None and n != c.processed_length for n in c.rebuilt_lengths)


def _step(path: list[dict[str, Any]], node: str, answer: bool, **numbers: Any) -> bool:
    path.append({"node": node, "question": dict((n[0], n[2]) for n in NODES)[node], "answer": bool(answer),
                 "numbers": numbers})
    return bool(answer)


def choose_branch(c: Controls) -> dict[str, Any]:
    """Walk the tree; {'branch': leaf, 'path': [decisions with their numbers]}."""
    path: list[dict[str, Any]] = []
    same, numbers = identical(c)
    if _step(path, "identical", same, **numbers):
        if c.resume_on == "fresh_instance" and c.fresh_bare_diff is not None:
            fresh = c.floor.differs(c.fresh_bare_diff) and c.fresh_restored_diff is not None and c.floor.matches(c.fresh_restored_diff)
            if _step(path, "fresh_state", fresh, fresh_without_state=c.fresh_bare_diff,
                     fresh_state_restored=c.fresh_restored_diff, noise_threshold=c.floor.threshold):
                return {"branch": "model_side_state", "path": path}
        failing = [a.name for a in c.arg_sets if not a.original_ok]
        _step(path, "fails_for_both", True, fail_for_both=failing, work_for_both=[a.name for a in c.arg_sets if a.original_ok])
        return {"branch": "resume_contract", "path": path}
    _step(path, "only_rebuilt", True, differing=[a.name for a in c.arg_sets if not consistent(a, c.floor)])
    if _step(path, "lengths_changed", lengths_changed(c) and bool(c.identity_identical),
             processed_length=c.processed_length, rebuilt_lengths=c.rebuilt_lengths,
             identity_matches=c.identity_identical, identity_worst_max_abs_diff=c.identity_worst, **c.extra):
        return {"branch": _compression_leaf(c, path), "path": path}
    if _step(path, "kv_differ", not c.kv_bitwise_equal, kv_max_abs_diff=c.kv_max_abs_diff):
        return {"branch": "reconstruction_copy", "path": path}
    if _step(path, "metadata_differ", not c.classes_equal or c.rebuilt_lengths != c.original_lengths,
             classes_equal=c.classes_equal, original_lengths=c.original_lengths, rebuilt_lengths=c.rebuilt_lengths):
        return {"branch": "cache_metadata", "path": path}
    restores = c.state_changed and c.restored_diff is not None and c.floor.matches(c.restored_diff)
    if _step(path, "state_restores", restores, state_changed_by_rebuild=c.state_changed, state_restored_max_abs_diff=c.restored_diff):
        return {"branch": "model_side_state", "path": path}
    _step(path, "nothing_visible", True, kv_bitwise_equal=c.kv_bitwise_equal, classes_equal=c.classes_equal)
    return {"branch": "unexplained", "path": path}


def position_shift(c: Controls) -> bool:
    """(a): the explicit-position step differs from generate()'s beyond the floor, and generate()'s position is not the
    logical one (both captured at the rotary embedding; a position not captured leaves the step difference to decide)."""
    gen, logical = c.extra.get("generate_position"), c.extra.get("logical_position")
    moved = gen is None or logical is None or gen != logical
    step = c.extra.get("explicit_vs_generate")
    return bool(moved and step is not None and c.floor.differs(step))


def information_loss(c: Controls) -> bool:
    """(b): at explicit logical positions the step still differs from the full forward beyond the floor."""
    explicit = c.extra.get("explicit_vs_full_forward")
    return explicit is not None and c.floor.differs(explicit)


def _compression_leaf(c: Controls, path: list[dict[str, Any]]) -> str:
    """The two compression questions, (a) positions and (b) information loss, each with its numbers."""
    gen, logical = c.extra.get("generate_position"), c.extra.get("logical_position")
    step, explicit = c.extra.get("explicit_vs_generate"), c.extra.get("explicit_vs_full_forward")
    numbers = {"generate_position": gen, "logical_position": logical, "explicit_vs_generate": step,
               "explicit_vs_full_forward": explicit, "noise_threshold": c.floor.threshold}
    loss = information_loss(c)
    if _step(path, "positions_shift", position_shift(c), **numbers):
        if _step(path, "positions_and_loss", loss, **numbers):
            return "compression_positions_and_loss"
        _step(path, "positions_restore", True, **numbers)  # (a) needs the explicit step, so (b) was measured
        return "compression_positions"
    settled = step is not None and c.floor.matches(step)
    if _step(path, "information_lost", loss and settled, **numbers):
        return "compression_information_loss"
    _step(path, "unresolved", True, **numbers)
    return "compression_unresolved"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_fmt(v) for v in value[:8]) + ", ...]"
    return str(value)


def render(rebuild: str, verdict: dict[str, Any]) -> str:
    """The tree as text, the taken path marked [x] (checked and no: [ ]), each decision with its numbers."""
    taken = {d["node"]: d for d in verdict["path"]}
    last = verdict["path"][-1] if verdict["path"] else {"numbers": {}}
    lines = [f"rebuild {rebuild!r}  ->  {verdict['branch']}: {MEANING[verdict['branch']]}",
             f"decided by: {'; '.join(f'{k}={_fmt(v)}' for k, v in last['numbers'].items()) or 'the first decision'}",
             f"next: {NEXT[verdict['branch']]}",
             "1. compare original and rebuilt caches under identical arguments"]
    for node, depth, question, leaf in NODES:
        d = taken.get(node)
        mark = "[x]" if d and d["answer"] else "[ ]" if d else "   "
        indent = "    " * depth
        lines.append(f"{indent}+-- {mark} {question}" + (f"  -> {leaf}" if leaf else ""))
        if d and d["numbers"]:
            lines.append(f"{indent}|       " + "; ".join(f"{k}={_fmt(v)}" for k, v in d["numbers"].items()))
    return "\n".join(lines)


# --- the notebook's claims on the built-ins ------------------------------------------------------

def decide_branch(verdict: dict[str, Any], expected: str) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """holds, evidence, deciding for 'this rebuild lands in `expected`'."""
    first = verdict["path"][0]["numbers"] if verdict["path"] else {}
    deciding = {"branch": verdict["branch"], "worst_max_abs_diff_vs_original": first.get("worst_max_abs_diff"),
                "noise_threshold": first.get("noise_threshold")}
    return verdict["branch"] == expected, {"expected_branch": expected, **verdict}, deciding


def decide_retained_length(c: Controls, generate_position: int | None, logical_position: int | None,
                           explicit_vs_generate: float | None) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """generate() gave the next token the retained length as its position, and the explicit-logical step differs."""
    retained = next((n for n in c.rebuilt_lengths if n is not None), None)  # the first attention layer's (what generate reads)
    shift = None if generate_position is None or logical_position is None else generate_position - logical_position
    expected_shift = None if retained is None else retained - c.processed_length
    holds = (shift is not None and retained != c.processed_length and shift == expected_shift
             and explicit_vs_generate is not None and c.floor.differs(explicit_vs_generate))
    deciding = {"generate_position": generate_position, "logical_position": logical_position,
                "retained_length": retained, "processed_length": c.processed_length,
                "explicit_vs_generate_max_abs_diff": explicit_vs_generate, "noise_threshold": c.floor.threshold}
    evidence = {**deciding, "position_shift": shift, "expected_shift_if_retained_length": expected_shift,
                **c.floor.evidence(explicit_vs_generate)}
    return holds, evidence, deciding


def per_layer_outcome(c: Controls, full: ArgSet, stage: str = "", error_layer: int | None = None) -> str:
    """'error', 'silent_difference' or 'no_difference' of generate() (full mask) from the per-layer cache."""
    if not full.rebuilt_ok:
        return "error"
    if full.max_abs_diff is not None and c.floor.differs(full.max_abs_diff):
        return "silent_difference"
    return "no_difference"


def decide_per_layer(c: Controls, full: ArgSet, mechanism: dict[str, Any]) -> tuple[bool, str, dict[str, Any], dict[str, Any]]:
    """holds, why, evidence, deciding: per-layer lengths reach generate() and it errors or silently differs."""
    distinct = len({n for n in c.rebuilt_lengths if n is not None}) > 1
    outcome = per_layer_outcome(c, full)
    holds = distinct and outcome in ("error", "silent_difference")
    stage = mechanism.get("stage") or "no error: every layer ran"
    mask = mechanism.get("attention_mask_shape")
    reached = (f"the first call got past length {mechanism.get('past_length_reported')} (layer 0's), position "
               f"{mechanism.get('generate_position')}, mask {mask if mask else 'none (generate passed no mask)'}; "
               f"attention masks per layer {mechanism.get('attention_masks')}")
    why = (f"generate() from per-layer lengths {c.rebuilt_lengths}: {outcome.replace('_', ' ')}"
           + (f" at {stage} (layer {mechanism.get('error_layer')}): {full.rebuilt_error}: {mechanism.get('error', '')}; {reached}" if outcome == "error" else
              f" (max |diff| vs original {_fmt(full.max_abs_diff)}, noise threshold {_fmt(c.floor.threshold)}); {reached}"))
    deciding = {"outcome": outcome, "rebuilt_lengths": c.rebuilt_lengths, "max_abs_diff_vs_original": full.max_abs_diff,
                "noise_threshold": c.floor.threshold}
    evidence = {**deciding, "stage": stage, **mechanism, **c.floor.evidence(full.max_abs_diff)}
    return holds, why, evidence, deciding


# Stated before the run (transformers #35168: layer-dependent lengths behave differently by backend):
PER_LAYER_PREDICTION = {"sdpa": "silent_difference", "eager": "error"}


def backend_outcome(o: dict[str, Any], floor: NoiseFloor) -> str:
    """'error' (raised inside attention), 'error_elsewhere', 'silent_difference' or 'no_difference' for one backend."""
    if not o["ok"]:
        return "error" if "attention" in (o.get("stage") or "") else "error_elsewhere"
    d = o.get("max_abs_diff_vs_original")
    return "silent_difference" if d is not None and floor.differs(d) else "no_difference"


def decide_per_layer_backends(outcomes: dict[str, dict[str, Any]], floor: NoiseFloor,
                              prediction: dict[str, str] = PER_LAYER_PREDICTION) -> tuple[bool, str, dict[str, Any], dict[str, Any]]:
    """holds, why, evidence, deciding: each backend's outcome is the one predicted before the run."""
    seen = {b: backend_outcome(o, floor) for b, o in outcomes.items()}
    holds = bool(seen) and all(seen.get(b) == want for b, want in prediction.items())
    why = "; ".join(f"{b}: predicted {prediction.get(b, '-')}, measured {seen[b]}"
                    + (f" ({outcomes[b]['error_type']} at {outcomes[b]['stage']})" if not outcomes[b]["ok"]
                       else f" (max |diff| {_fmt(outcomes[b]['max_abs_diff_vs_original'])})") for b in seen)
    deciding = {f"{b}_outcome": v for b, v in seen.items()} | {"noise_threshold": floor.threshold}
    return holds, why, {"prediction": prediction, "outcomes": outcomes, **deciding}, deciding
