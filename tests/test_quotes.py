"""helpers.quotes: every claim a notebook declares has an entry, of the role its kind asks; every quote is verbatim
in the source text (whitespace aside); the source values the decisions show come from their claim's quote; and
helpers.results attaches the entry to each claim of a results file."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from helpers import findings, quotes
from helpers.boundary import decisions as boundary_decisions, splits as boundary_splits
from helpers.identity import decisions as identity_decisions
from helpers.mask_matrix import decisions as matrix_decisions
from helpers.rope import decisions as rope_decisions
from helpers.pipeline.paths import repo_root
from helpers.pipeline.report import statements
from helpers.results import Results

ROOT = repo_root()
SEEDS = ROOT.parent / "shared" / "seeds"  # the source texts, as a test fixture only (the kit cites public names)
SEED_FILES = {quotes.CONTROL: "resume-contract-qwen3-vl-control.txt", quotes.ISSUE_48947: "hybrid-offloading-drift-report.txt"}


def declared() -> dict[str, str]:
    """{claim id: kind} over every notebook: its CLAIMS and KINDS assignments executed alone."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "CLAIMS = {" not in src:
                continue
            lines = src.splitlines()  # the cell's imports, then CLAIMS and KINDS, up to session.start
            body = "\n".join(line for line in lines[: next(i for i, l in enumerate(lines) if "session.start(" in l or "session.begin(" in l)])
            ns: dict = {}
            exec(body, ns)  # noqa: S102 - the notebook's own imports and assignments
            env = re.findall(r'environment_checks=\(([^)]*)\)', src)
            envs = set(re.findall(r'"([^"]+)"', env[0])) if env else set()
            for cid in ns["CLAIMS"]:
                found[cid] = "environment" if cid in envs else ns.get("KINDS", {}).get(cid, "reproduces")
    return found


def test_every_declared_claim_has_a_quote_of_its_kinds_role_and_no_entry_is_stale():
    claims = declared()
    assert len(claims) >= 50
    missing = sorted(set(claims) - set(findings.quotes()))
    assert not missing, f"claims without a quote in their finding's declaration (helpers/findings.py): {missing}"
    assert not sorted(set(findings.quotes()) - set(claims)), "entries for claims no notebook declares"
    wrong = {cid: (kind, findings.quotes()[cid].role) for cid, kind in claims.items() if findings.quotes()[cid].role != quotes.ROLES[kind]}
    assert not wrong, f"role does not match the claim's kind: {wrong}"
    for cid, kind in claims.items():
        if kind != "environment":
            assert findings.quotes()[cid].text and findings.quotes()[cid].source in SEED_FILES, cid


def seeds_or_skip(seeds: Path, ci: bool) -> None:
    """Skip where the source texts are absent, except under CI (CI=true), where they are checked out: fail there."""
    missing = [name for name in SEED_FILES.values() if not (seeds / name).is_file()]
    if not missing:
        return
    why = f"the source texts are not beside this checkout (../shared/seeds): {missing}"
    if ci:
        pytest.fail(f"CI=true: {why}; a skip here would hide a misquote", pytrace=False)
    pytest.skip(why)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def test_every_quote_is_verbatim_in_its_source():
    seeds_or_skip(SEEDS, _ci())
    texts = {key: quotes.normalized((SEEDS / name).read_text()) for key, name in SEED_FILES.items()}
    bad = {cid: q.text for cid, q in findings.quotes().items() if q.text and q.text not in texts[q.source]}
    assert not bad, f"not verbatim in the source: {bad}"


def test_missing_seeds_fail_under_ci_and_skip_elsewhere(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        seeds_or_skip(tmp_path, ci=True)
    with pytest.raises(pytest.skip.Exception, match="not beside this checkout"):
        seeds_or_skip(tmp_path, ci=False)
    for name in SEED_FILES.values():
        (tmp_path / name).write_text("x")
    seeds_or_skip(tmp_path, ci=True)  # present: neither


def _number_texts(value) -> list[str]:
    """How a source value is written in its quote: lists as [1, 0], numbers as written; zeros and counts like 3/3 skipped."""
    if isinstance(value, list):
        return ["[" + ", ".join(str(v) for v in value) + "]"] if len(value) > 1 else _number_texts(value[0])
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
        return [str(value)]
    return []


@pytest.mark.parametrize("claim_id, values", [
    ("identity.cache_metadata_match", identity_decisions.SOURCE_METADATA), ("matrix.neither_fails", matrix_decisions.SOURCE_DROPPED),
    ("matrix.position_only_fails", matrix_decisions.SOURCE_DROPPED), ("matrix.mask_only_works", matrix_decisions.SOURCE_WORKED),
    ("rope.state_outside_kv", rope_decisions.SOURCE_STATE), ("rope.missing_state_diverges_more_than_off_by_one",
                                                   {**rope_decisions.SOURCE_NONE, **rope_decisions.SOURCE_PLUS_1}),
    ("boundary.double_processing_diverges", boundary_decisions.SOURCE_DOUBLE),
    ("boundary.double_processing_cosine", {"cosine": boundary_splits.SOURCE_COSINE})])
def test_source_values_come_from_the_quote(claim_id, values):
    text = findings.quotes()[claim_id].text
    for key, value in values.items():
        for number in _number_texts(value):
            assert number in text, f"{claim_id}: source value {key}={number} is not in its quote {text!r}"


def test_results_attach_the_quote_and_a_claim_without_one_gets_none(tmp_path):
    res = Results("04_x", {"boundary.double_processing_top1_changed": "s", "new.claim": "t"}, env={}, path=tmp_path / "r.json")
    data = json.loads(Path(res.path).read_text())
    got = {c["id"]: c["quote"] for c in data["claims"]}
    assert got["boundary.double_processing_top1_changed"] == {"source": "control", "text": "top-1 token: changed", "role": "states"}
    assert got["new.claim"] == {}


def test_two_claims_quoting_one_passage_are_one_statement():
    key = statements.statement_key
    assert key({"id": "identity.first_step_logits_equal"}) == key({"id": "triage.identity_matches_original"})
    assert key({"id": "matrix.first_call_drops_suffix"}) == key({"id": "regress.mask_contract_holds_across_families"})
    assert key({"id": "boundary.double_processing_top1_changed"}) != key({"id": "boundary.double_processing_cosine"})
    assert key({"id": "x.unregistered"}) == "claim: x.unregistered"
