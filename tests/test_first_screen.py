"""SUMMARY.md's first screen (before the first <details>): at most 4,000 characters with every source's verdict, the
releases measured (make matrix of the same kit commit, else this run's), what was not verified, and each source's
repro; the headline counts distinct quoted statements; each repro runs in a fresh interpreter importing no kit code."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import quotes
from helpers.pipeline.paths import repo_root
from helpers.pipeline.report import claims_md, first_screen, sources, statements, summary

ROOT = repo_root()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PREFIX = {"identity": "01_identity_reconstruction", "matrix": "02_mask_position_matrix", "rope": "03_rope_deltas_perturbation",
          "boundary": "04_token_boundary_double_processing", "offload": "05_hybrid_offloading_drift",
          "triage": "06_rebuild_triage", "regress": "07_regression_families", "api": "08_resume_api",
          "newimage": "09_new_image_turn", "rollback": "10_rollback_hybrid"}
KIND_OF_ROLE = {role: kind for kind, role in quotes.ROLES.items()}
NEEDS_CUDA = "needs CUDA: offloading moves cache tensors GPU<->CPU on two CUDA streams; here device='cpu'"
NOT_HERE = {"boundary.double_processing_top1_changed", "boundary.double_processing_cosine"}


def verdict(cid: str, kind: str) -> tuple[str, str]:
    if cid.startswith("offload.") and kind in ("reproduces", "refutes", "beyond") and cid != "offload.linear_layers_never_moved" \
            and not cid.startswith(("offload.prefetch", "offload.race_not", "offload.report", "offload.generate")):
        return "skipped", NEEDS_CUDA
    if cid in NOT_HERE:
        return "not_reproduced", "the tiny random-weight model does not show it"
    return {"reproduces": "reproduced", "refutes": "refuted"}.get(kind, "holds"), "measured"


def fake_run(out: Path, release: str = "5.17.0", run_id: str = "20261205T000000Z-fake", commit: str = COMMIT,
             tiny: bool = True) -> None:
    """Results of every registered claim, as a run of the whole kit on the tiny CPU defaults would leave them."""
    by_nb: dict[str, list[dict]] = {}
    for cid, q in quotes.QUOTES.items():
        kind = KIND_OF_ROLE[q.role]
        v, why = verdict(cid, kind)
        by_nb.setdefault(PREFIX[cid.split(".")[0]], []).append(
            {"id": cid, "statement": f"statement of {cid}", "kind": kind, "verdict": v, "reason": why, "evidence": {},
             "deciding": {"max_abs_diff": 0.187}, "source": {}, "notes": [], "quote": q.as_dict()})
    env = {"transformers": release, "device": "cpu", "dtype": "float32", "cuda_available": False,
           "model_id": "tiny-qwen3-vl" if tiny else "Qwen/Qwen3-VL-2B-Instruct"}
    stamp = {"run_id": run_id, "started": "2026-12-05T00:00:00Z", "kit_commit": commit, "kit_dirty": False}
    (out / "results").mkdir(parents=True, exist_ok=True)
    for nb, claims in by_nb.items():
        (out / "results" / f"{nb}.json").write_text(json.dumps({"notebook": nb, "run": stamp, "environment": env,
                                                               "claims": claims, "measurements": {}}))
    (out / "run.json").write_text(json.dumps({**stamp, "command": "run-all", "status": "complete",
                                              "finished": "2026-12-05T00:01:00Z",
                                              "notebooks": {nb: {"status": "ok"} for nb in by_nb}}))


def matrix(out: Path, releases: tuple[str, ...] = ("5.14.1", "5.24.0"), commit: str = COMMIT) -> None:
    for rel in releases:
        fake_run(out / "matrix" / rel, rel, commit=commit)
    (out / "matrix" / "run.json").write_text(json.dumps({"run_id": "m", "command": "matrix", "status": "complete",
                                                         "kit_commit": commit, "kit_dirty": False}))


def screen(out: Path) -> str:
    return summary.first_screen_of(summary.build_summary(out))


def test_the_first_screen_fits_with_both_sources_verdicts_releases_and_repros(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    text = screen(tmp_path)
    assert len(text) <= first_screen.FIRST_SCREEN_CHARS, len(text)
    assert "- **Qwen3-VL control:** ☑️" in text and "- **`#48947`:** ⏭️ not tested here (needs CUDA): 2 statement(s)" in text
    missed = text.split("❌ not reproduced: ", 1)[1].splitlines()[0]
    assert sorted(missed.split(", ")) == ['"cosine similarity: 0.8698"', '"top-1 token: changed"']
    assert '✅ hypothesis refuted: "only the correctness of the linear_attention' in text
    assert "1 simulation(s) (holds by construction)" in text
    assert ("**Releases measured** (`make matrix` of this kit commit, every notebook): "
            "**5.14.1, 5.17.0 (this run), 5.24.0**: Qwen3-VL control 16 of 18") in text
    assert "`#48947` not tested (needs CUDA)" in text
    assert "**Not verified here:** the real checkpoints" in text and "need CUDA (`make gpu-check`;" in text
    whole = summary.build_summary(tmp_path)
    for source in sources.SOURCES.values():  # the two reports' repros on the screen; a longer one folded right below
        if source.repro:
            body = (ROOT / source.repro).read_text().rstrip()
            assert body in (text if source.key in ("control", "48947") else whole), source.key
    assert "- **Qwen3-VL new image:** ✅ 8 of 8 own checks hold (kind beyond" in text
    assert "**Repro, Qwen3-VL new image:** `examples/repro/qwen3_vl_new_image_turn.py` (folded below)." in text
    assert text.count("```python") == 2
    assert whole.split("<details>", 2)[1].startswith("<summary>Repro, Qwen3-VL new image"), "folded first, right below"


def test_a_repro_that_does_not_fit_is_folded_and_named_on_the_screen(tmp_path):
    fake_run(tmp_path)
    screen_lines, folded = first_screen.first_screen(tmp_path, {}, [], "headline", budget=1500)
    text = "\n".join(screen_lines)
    assert "```python" not in text and len(folded) == sum(bool(s.repro) for s in sources.SOURCES.values())
    for s in sources.SOURCES.values():
        if s.repro:
            assert f"{s.repro}` (folded below)." in text


def test_the_release_line_without_a_matrix_of_this_commit_says_so(tmp_path):
    fake_run(tmp_path)
    assert "**Releases measured:** **5.17.0 (this run)**: " in screen(tmp_path)
    assert 'only the release this run used; `make matrix RELEASES="5.14.1 5.24.0"` then `make report`' in screen(tmp_path)
    matrix(tmp_path, commit="f" * 40)
    text = screen(tmp_path)
    assert "**5.14.1**" not in text and "(`outputs/matrix` is from another kit commit: not shown)" in text


def test_the_headline_counts_each_quoted_statement_once(tmp_path):
    fake_run(tmp_path)
    text = summary.build_summary(tmp_path)
    reps = [(cid, q) for cid, q in quotes.QUOTES.items() if q.role == "states"]
    distinct = {(q.source, q.text) for _, q in reps}
    assert len(distinct) < len(reps), "01/06 and 02/07 quote one statement each"
    done = len(distinct) - len(NOT_HERE) - 2  # two #48947 statements skipped
    assert f"**{done} of {len(distinct)} source statement(s) reproduced** (distinct quoted statements of {len(reps)} " in text


def _c(cid: str, v: str, kind: str = "reproduces") -> tuple[str, dict]:
    return ("01_x", {"id": cid, "kind": kind, "verdict": v, "reason": ""})


def test_a_statement_checked_twice_is_reproduced_only_when_no_check_fails():
    both = [_c("identity.first_step_logits_equal", "reproduced"), _c("triage.identity_matches_original", "reproduced")]
    assert [s.verdict for s in statements.statements(both)] == ["reproduced"]
    one_fails = [both[0], _c("triage.identity_matches_original", "not_reproduced")]
    assert [s.verdict for s in statements.statements(one_fails)] == ["not_reproduced"]
    skipped = [_c("offload.prefill_identical", "skipped"), _c("offload.decode_drifts", "error")]
    assert [s.verdict for s in statements.statements(skipped)] == ["skipped", "error"]
    assert [s.verdict for s in statements.statements([_c("x.new", "reproduced"), _c("y.new", "reproduced")])] == \
        ["reproduced", "reproduced"], "unregistered claims are statements of their own"
    counts = claims_md.kind_counts(one_fails)
    assert claims_md.headline(counts, 2, statements.statements(one_fails)).startswith("**0 of 1 source statement(s) reproduced**")


def test_verdict_words_for_refutations_and_untested_sources():
    assert claims_md.verdict_text("refutes", "refuted") == "✅ hypothesis refuted"
    assert claims_md.verdict_text("refutes", "not_refuted") == "❌ hypothesis not refuted"
    skipped = [("05_x", {"id": "offload.prefill_identical", "kind": "reproduces", "verdict": "skipped", "reason": NEEDS_CUDA})]
    assert first_screen.source_verdict(skipped) == "⏭️ not tested here (needs CUDA): 1 statement(s)"
    other = [("05_x", {**skipped[0][1], "reason": "no flash_attn"})]
    assert "not tested here (skipped or in error" in first_screen.source_verdict(other)


def test_a_missing_repro_file_is_said_not_hidden():
    src = sources.Source("x", "X", repro="examples/repro/none.py", repro_prints="a number", short="X")
    assert "is missing from this checkout" in "\n".join(first_screen.repro_block(src))


# --------------------------------------------------------------------------- the repros, each in a fresh interpreter

REPROS = [s for s in sources.SOURCES.values() if s.repro]


@pytest.mark.parametrize("source", REPROS, ids=lambda s: s.key)
def test_each_repro_imports_only_torch_and_transformers(source):
    tree = ast.parse((ROOT / source.repro).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert mods - set(sys.stdlib_module_names) <= {"torch", "transformers"}, mods  # no third-party package besides them
    assert set(source.repro_claims) <= set(quotes.QUOTES)


def _fresh(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`code` in a new interpreter started in an empty folder, failing if anything of the kit was imported."""
    check = "import sys; assert not [m for m in sys.modules if m == 'helpers' or m.startswith('helpers.')]"
    return subprocess.run([sys.executable, "-c", f"{code}\n{check}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_the_48947_repro_says_it_needs_cuda_and_exits_0_without_it(tmp_path):
    path = ROOT / sources.SOURCES["48947"].repro
    done = _fresh(f"import runpy; runpy.run_path({str(path)!r}, run_name='__main__')", tmp_path)
    if "needs CUDA" not in done.stdout:
        pytest.skip("CUDA is present: the loop ran")
    assert done.returncode == 0 and done.stdout.startswith("needs CUDA"), done.stderr


def test_the_control_repro_prints_the_first_calls_shapes(tmp_path):
    path = ROOT / sources.SOURCES["control"].repro
    done = _fresh(f"import runpy; runpy.run_path({str(path)!r}, run_name='__main__')", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["neither: first model call input_ids shape [1, 0]; failed (RuntimeError)",
                                        "mask_only: first model call input_ids shape [1, 1]; worked"]


@pytest.mark.e2e
def test_the_48947_loop_runs_on_cpu_with_the_offloaded_arm_standing_in(tmp_path):
    """Every line of the CUDA path on CPU: cuda -> cpu, the offloaded cache -> the plain one (offloading needs CUDA
    streams), 4096 -> 64 tokens: the loop prints four steps, all 0.0."""
    text = (ROOT / sources.SOURCES["48947"].repro).read_text()
    for old, new in (('"cuda"', '"cpu"'), ("torch.cuda.is_available()", "True"), ("offloading=True)", "offloading=False)"),
                     ("4096", "64"), ("torch.bfloat16", "torch.float32")):
        assert old in text, old
        text = text.replace(old, new)
    done = _fresh(text, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{step} max_abs_diff 0.0" for step in range(4)]


def test_releases_with_other_verdicts_get_an_entry_of_their_own(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    path = tmp_path / "matrix" / "5.24.0" / "results" / "02_mask_position_matrix.json"
    data = json.loads(path.read_text())
    data["claims"][0]["verdict"] = "not_reproduced"
    path.write_text(json.dumps(data))
    text = screen(tmp_path)
    assert "**5.14.1, 5.17.0 (this run), 5.24.0**: Qwen3-VL control 16 of 18 on 5.14.1/5.17.0, 15 of 18 on 5.24.0 · " in text


def test_the_kits_own_checks_are_shown_per_release_only_where_they_change(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    head = next(line for line in screen(tmp_path).splitlines() if line.startswith("**Releases measured"))
    assert "own checks" not in head.split("· `#48947`", 1)[0], "the control's own checks do not change: not shown"
    path = tmp_path / "matrix" / "5.24.0" / "results" / "05_hybrid_offloading_drift.json"
    data = json.loads(path.read_text())
    for c in data["claims"]:
        if c["kind"] == "beyond" and c["verdict"] == "holds":
            c["verdict"] = "fails"
    path.write_text(json.dumps(data))
    text = screen(tmp_path)
    line = next(line for line in text.splitlines() if line.startswith("**Releases measured"))
    assert "`#48947` not tested (needs CUDA); own checks 5 of 5 on 5.14.1/5.17.0, 0 of 5 on 5.24.0 · " in line
    assert line.endswith("Qwen3-VL new image own checks 8 of 8."), "a source with no statement shows its own checks"
