"""Notebook 08's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, ENGINES, IDENTITY, VALIDATION, passage

_FACTORY = "validating K/V shapes, dtype, device, and batch size;"
_CONTRACT = ("Resuming generate() from a non-empty cache requires an unambiguous contract between the cached prefix, the "
             "unprocessed suffix, the full attention mask, and any model-specific positional state.")

FINDING = Finding(
    stem="08_resume_api",
    title=("The control's proposed resume API, prototyped: a validated K/V factory and a resume guard, run against "
           "every case the kit measures"),
    source="control",
    claims={
        "api.guard_catches_or_names_every_silent_case": passage(CONTROL, "extends", VALIDATION),
        "api.guard_passes_every_valid_call": passage(CONTROL, "extends", VALIDATION),
        "api.factory_matches_original_every_family": passage(CONTROL, "extends", IDENTITY),
        "api.factory_refuses_malformed_inputs": passage(CONTROL, "extends", _FACTORY),
        "api.resume_state_portable_to_fresh_instance": passage(CONTROL, "extends", "- original model instance versus fresh model instance;"),
        "api.ledger_guard_refuses_every_silent_tracked_case": passage(CONTROL, "extends", _CONTRACT),
        "api.every_refusal_advice_restores": passage(CONTROL, "extends", VALIDATION),
        "api.resume_matches_full_forward": passage(CONTROL, "extends", ENGINES),
    },
    bisect="api.guard_catches_or_names_every_silent_case",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/proposal/decisions.py", ("*",), "tests/test_kill_api.py"),
               Decisions("helpers/proposal/ledger_decisions.py", ("*",), "tests/test_kill_ledger.py")),
    estimate_s=6.0,
    summary=("The control's proposed API, prototyped as the `kvresume` library: a validated K/V factory, the token "
             'ledger (`track(model)`), the resume guard and `resume()`, measured on every resume call the kit makes.'),
    models="`tiny-qwen3-vl`, `tiny-qwen3`, `tiny-qwen3-sliding`, `tiny-qwen3.5-hybrid`",
    needs="CPU",
)
