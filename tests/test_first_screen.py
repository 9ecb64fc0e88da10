"""SUMMARY.md's first screen (before the first <details>): at most 4,000 characters with every source's verdict, the
releases measured (make matrix of the same kit commit, else this run's), what was not verified, and each source's
repro; the headline counts distinct quoted statements; each repro runs in a fresh interpreter importing no kit code."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import findings, quotes
from helpers.boundary import splits as boundary_splits
from helpers.pipeline.paths import repo_root
from helpers.pipeline.report import first_screen, share, sources, statements, summary, verdict_line

ROOT = repo_root()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PREFIX = findings.prefixes()  # claim id prefix -> its notebook
KIND_OF_ROLE = {role: kind for kind, role in quotes.ROLES.items()}
NEEDS_CUDA = "needs CUDA: offloading moves cache tensors GPU<->CPU on two CUDA streams; here device='cpu'"
NOT_HERE = {"boundary.double_processing_top1_changed", "boundary.double_processing_cosine"}


def verdict(cid: str, kind: str) -> tuple[str, str]:
    if cid.startswith("offload.") and kind in ("reproduces", "refutes", "beyond") and cid != "offload.linear_layers_never_moved" \
            and not cid.startswith(("offload.prefetch", "offload.race_not", "offload.report", "offload.generate")):
        return "skipped", NEEDS_CUDA
    if cid in NOT_HERE:
        return "skipped", boundary_splits.by_chance(cid, {"ran": 40, "top1_changed": 12, "top1_changed_rate": 0.3,
                                                   "cosine_min": 0.97, "cosine_max": 0.99, "cosine_median": 0.98})
    return {"reproduces": "reproduced", "refutes": "refuted"}.get(kind, "holds"), "measured"


def fake_run(out: Path, release: str = "5.17.0", run_id: str = "20261205T000000Z-fake", commit: str = COMMIT,
             tiny: bool = True) -> None:
    """Results of every registered claim, as a run of the whole kit on the tiny CPU defaults would leave them."""
    by_nb: dict[str, list[dict]] = {}
    for cid, q in findings.quotes().items():
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


def matrix(out: Path, releases: tuple[str, ...] = ("5.25.0",), commit: str = COMMIT, share: bool = True) -> None:
    """outputs/matrix/ of `releases` (the same kit commit by default) and, as `make share` leaves it, releases.json."""
    for rel in releases:
        fake_run(out / "matrix" / rel, rel, commit=commit)
    (out / "matrix" / "run.json").write_text(json.dumps({"run_id": "m", "command": "matrix", "status": "complete",
                                                         "kit_commit": commit, "kit_dirty": False}))
    if share:
        (out / "releases.json").write_text(json.dumps({"pinned": "5.17.0", "newest": releases[-1],
                                                       "resolved": "package index"}))


def screen(out: Path) -> str:
    return summary.first_screen_of(summary.build_summary(out))


def block(text: str, name: str) -> list[str]:
    """A source's lines on the screen: its name, the Verdict line, the Ask line."""
    lines = text.splitlines()
    at = lines.index(f"**{name}**")
    return lines[at: at + 3]


def test_the_first_screen_fits_with_each_sources_verdict_ask_and_own_count_on_pinned_and_newest(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    text = screen(tmp_path)
    assert len(text) <= first_screen.screen_chars(), len(text)
    assert "**Releases:** **5.17.0** (pinned) and **5.25.0** (newest), by `make share` (newest on the package index" in text
    assert "source statement(s) reproduced**" not in text and "of 20" not in text, "no count pooled across sources"
    assert len([ln for ln in text.splitlines() if re.search(r"\bask\b", ln, re.I)]) >= 3
    for name in ("Qwen3-VL control", "`#48947`", "Qwen3-VL new image"):
        head, verdict, ask = block(text, name)
        assert verdict.startswith("- Verdict: ") and ask.startswith("- Ask: "), (name, verdict, ask)
        assert "on 5.17.0 and 5.25.0" in verdict, (name, verdict)  # its verdict on both releases
        assert not re.search("[✅❌☑️⏭️]", verdict), "words, not check marks"
    control = block(text, "Qwen3-VL control")[1]
    # 16 distinct quoted statements of the control: -42 by construction, the [1, 0] explanation cited, 2 not decided
    assert "reproduced 14 of 14 on 5.17.0 and 5.25.0 (statements tested)" in control, control
    assert '"rope_deltas = -42" by construction' in control
    assert "1 decided by the same measurement as `matrix.neither_fails` (cited, not recounted)" in control
    assert "2 not tested here" in control
    offload = block(text, "`#48947`")[1]
    assert "2 not tested here (needs CUDA)" in offload and "1 simulation(s)" in offload
    assert "reproduced" not in offload.split("not tested")[0], "nothing tested is not 'reproduced'"
    assert "the kit's own checks hold 8 of 8 on 5.17.0 and 5.25.0" in block(text, "Qwen3-VL new image")[1]
    whole = summary.build_summary(tmp_path)
    members = share.share_members(tmp_path, None)
    for source in findings.sources().values():  # every repro named on the screen and in share.zip, none pasted
        if source.repro:
            name = Path(source.repro).name
            assert name in text and f"repro/{name}" in members and "```python" not in whole, source.key
    assert "```python" not in text


def test_a_one_source_run_folds_its_repro_in_below_the_screen_and_share_zip_carries_it(tmp_path):
    """One thread's paste: `make run-all NB=11` gives that source's repro in the summary itself."""
    fake_run(tmp_path)
    for path in (tmp_path / "results").glob("*.json"):
        if not path.name.startswith("11_"):
            path.unlink()
    repro = (ROOT / findings.sources()["serve"].repro)
    whole, text = summary.build_summary(tmp_path), screen(tmp_path)
    assert "**Repro** in `examples/repro/`" in text and repro.name in text and "```python" not in text
    assert repro.read_text().rstrip() in whole and whole.count("```python") == 1
    with zipfile.ZipFile(share.write_share(tmp_path, share.current_stems(tmp_path))) as zf:
        assert zf.read(f"repro/{repro.name}") == repro.read_bytes()
        assert [n for n in zf.namelist() if n.startswith("repro/")] == [f"repro/{repro.name}"]


def test_without_make_share_the_screen_names_the_release_it_has_and_how_to_add_the_newest(tmp_path):
    fake_run(tmp_path)
    text = screen(tmp_path)
    assert "**Releases:** **5.17.0** only: `make share` also measures the newest release on the package index." in text
    matrix(tmp_path, commit="f" * 40)  # another kit commit's matrix: not shown
    text = screen(tmp_path)
    assert "**5.25.0**" not in text and "on 5.17.0 and 5.25.0" not in text


def test_offline_resolution_is_said_on_the_screen(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    (tmp_path / "releases.json").write_text(json.dumps({"pinned": "5.17.0", "newest": "5.25.0",
                                                        "resolved": "offline (newest the kit knows; no network)"}))
    assert "by `make share` (offline (newest the kit knows; no network))." in screen(tmp_path)


def test_a_release_with_another_verdict_gets_its_own_count(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    path = tmp_path / "matrix" / "5.25.0" / "results" / "02_mask_position_matrix.json"
    data = json.loads(path.read_text())
    next(c for c in data["claims"] if c["id"] == "matrix.mask_only_works")["verdict"] = "not_reproduced"
    path.write_text(json.dumps(data))
    control = block(screen(tmp_path), "Qwen3-VL control")[1]
    assert "reproduced 14 of 14 on 5.17.0; 13 of 14 on 5.25.0 (statements tested)" in control, control


def _c(cid: str, v: str, kind: str = "reproduces", **quote: str) -> tuple[str, dict]:
    claim = {"id": cid, "kind": kind, "verdict": v, "reason": ""}
    if quote:
        claim["quote"] = {"source": "control", "role": "states", **quote}
    return ("01_x", claim)


def test_a_statement_checked_twice_is_reproduced_only_when_no_check_fails():
    both = [_c("identity.first_step_logits_equal", "reproduced"), _c("triage.identity_matches_original", "reproduced")]
    assert [s.verdict for s in statements.statements(both)] == ["reproduced"]
    one_fails = [both[0], _c("triage.identity_matches_original", "not_reproduced")]
    assert [s.verdict for s in statements.statements(one_fails)] == ["not_reproduced"]
    skipped = [_c("offload.prefill_identical", "skipped"), _c("offload.decode_drifts", "error")]
    assert [s.verdict for s in statements.statements(skipped)] == ["skipped", "error"]
    assert [s.verdict for s in statements.statements([_c("x.new", "reproduced"), _c("y.new", "reproduced")])] == \
        ["reproduced", "reproduced"], "unregistered claims are statements of their own"


# --------------------------------------------------------------------------- the counting rules

def test_one_measurement_decides_one_statement_a_claim_citing_it_is_not_counted_again():
    own = _c("a.first", "reproduced", text="first call [1, 0]")
    cites = _c("a.second", "reproduced", text="the token was sliced away", cites="a.first")
    c = statements.count(statements.statements([own, cites]))
    assert [len(c.tested), len(c.reproduced), len(c.cited)] == [1, 1, 1]
    failing_citer = _c("a.second", "not_reproduced", text="the token was sliced away", cites="a.first")
    c = statements.count(statements.statements([own, failing_citer]))
    assert [len(c.tested), len(c.reproduced), len(c.cited)] == [1, 1, 1], "a cited statement never moves the count"
    measured_too = _c("b.third", "reproduced", text="the token was sliced away")  # one claim measures it itself
    c = statements.count(statements.statements([own, cites, measured_too]))
    assert [len(c.tested), len(c.reproduced), len(c.cited)] == [2, 2, 0]


def test_a_value_fixed_by_construction_is_listed_apart_never_reproduced():
    built = _c("r.deltas", "reproduced", text="rope_deltas = -42", by_construction="the prompt sets it")
    c = statements.count(statements.statements([built, _c("r.other", "reproduced", text="x")]))
    assert [len(c.tested), len(c.reproduced), len(c.by_construction)] == [1, 1, 1]
    assert statements.count(statements.statements([built])).reproduced == []
    assert findings.quotes()["rope.state_outside_kv"].by_construction, "the prompt fixes -42"


def test_the_registry_cites_what_one_measurement_decides():
    assert findings.quotes()["matrix.first_call_drops_suffix"].cites == "matrix.neither_fails"
    assert findings.quotes()["rope.fresh_instance_diverges"].cites == "rope.missing_state_diverges_more_than_off_by_one"
    for cid, q in findings.quotes().items():
        assert not q.cites or (q.cites in findings.quotes() and not findings.quotes()[q.cites].cites), cid  # one hop, registered


def test_own_checks_leave_out_citing_and_undecided_claims():
    claims = [_c("o.a", "holds", "beyond"), _c("o.b", "fails", "beyond"), _c("o.c", "skipped", "beyond"),
              _c("o.d", "holds", "beyond", text="t", cites="o.a")]
    assert statements.own_checks(claims) == (1, 2)


def test_not_tested_statements_say_why_and_are_not_in_the_tested_count():
    skipped = [("05_x", {"id": "offload.prefill_identical", "kind": "reproduces", "verdict": "skipped", "reason": NEEDS_CUDA})]
    line = verdict_line.count_line({"5.17.0": skipped})
    assert line == "1 not tested here (needs CUDA)", line  # by construction under the GPU check's lag, not run here
    ran = [("05_x", {**skipped[0][1], "verdict": "reproduced", "reason": "lagged"})]
    assert verdict_line.count_line({"5.17.0": ran}).startswith("apart: `offload.prefill_identical` by construction"), \
        "measured: listed apart, named by its claim where its value is too long to say whole"
    rate = ("04_x", {"id": "boundary.double_processing_top1_changed", "kind": "reproduces", "verdict": "skipped",
                     "reason": boundary_splits.by_chance("boundary.double_processing_top1_changed",
                                                  {"ran": 40, "top1_changed": 12, "top1_changed_rate": 0.3})})
    line = verdict_line.count_line({"5.17.0": [rate]})
    assert "top-1 changed on 12 of 40 prompts (30%): a tiny random-weight model decides it by chance, the real 2B checkpoint decides it)" in line
    assert "reproduced" not in line
    cos = ("04_x", {"id": "boundary.double_processing_cosine", "kind": "reproduces", "verdict": "skipped",
                    "reason": boundary_splits.by_chance("boundary.double_processing_cosine",
                                                 {"ran": 40, "cosine_min": 0.97, "cosine_max": 0.99, "cosine_median": 0.98})})
    both = verdict_line.count_line({"5.17.0": [rate, cos]})  # one shared reason said once, after both measurements
    assert both.count("the real 2B checkpoint decides it") == 1 and "12 of 40 prompts (30%); cosine 0.970-0.990" in both, both


def test_a_tiny_models_coin_flip_is_a_rate_over_at_least_30_prompts_and_the_real_checkpoint_decides():
    assert boundary_splits.RATE_PROMPTS >= 30
    why = boundary_splits.by_chance("boundary.double_processing_top1_changed", {"ran": 40, "top1_changed": 12,
                                                                          "top1_changed_rate": 0.3})
    assert "12 of 40 prompts (30%)" in why and "the real 2B checkpoint decides it" in why
    why = boundary_splits.by_chance("boundary.double_processing_cosine", {"ran": 40, "cosine_min": 0.97, "cosine_max": 0.99,
                                                                    "cosine_median": 0.98})
    assert "cosine 0.970-0.990 (median 0.980) over 40 prompts against the source's 0.8698" in why


def test_a_bisect_record_gives_the_first_release_and_the_added_source_line(tmp_path):
    from helpers.pipeline.report import asks

    (tmp_path / "bisect").mkdir()
    diff = ("--- a\n+++ b\n     if self.offloading:\n+        # ordered\n+        if default:\n"
            "+            self.prefetch_stream.wait_stream(default)\n")
    (tmp_path / "bisect" / "05-offload.prefetch_reads_unordered_copy.json").write_text(json.dumps(
        {"status": "complete", "changes": [{"last_same": "5.19.0", "first_different": "5.20.0",
                                            "source_diff": {"Cache.update": {"status": "changed", "diff": diff}}}]}))
    got = asks.first_change(tmp_path, "05", "offload.prefetch_reads_unordered_copy", ["5.17.0", "5.25.0"], True)
    assert got == ("first changed in 5.20.0 (`make bisect`: same through 5.19.0; "
                   "`Cache.update`: `+ self.prefetch_stream.wait_stream(default)`)")
    none = asks.first_change(tmp_path, "02", "matrix.neither_fails", ["5.17.0", "5.25.0"], True)
    assert none == "first release that changed: `make bisect NB=02 CLAIM=matrix.neither_fails GOOD=5.17.0 BAD=5.25.0`"
    assert asks.first_change(tmp_path, "02", "matrix.neither_fails", ["5.17.0", "5.25.0"], False) == ""


def test_a_source_without_a_writer_is_refused_by_name_not_given_generic_lines():
    from helpers.pipeline.report import asks

    with pytest.raises(KeyError, match="hybrid-rollback has no Ask writer"):
        asks.lines_for("hybrid-rollback", {"5.17.0": [("10_x", {"id": "x.a", "verdict": "holds", "reason": "r"})]}, Path("."))


def test_a_rendered_page_opens_with_the_title_then_the_verdict_and_the_ask_above_the_code(tmp_path):
    import nbformat

    from helpers.pipeline.report import html

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 09 · A title\n\nA long text."),
                                         nbformat.v4.new_code_cell("print(1)")])
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "09_new_image_turn.ipynb"
    nbformat.write(nb, str(path))
    claim = {"id": "newimage.natural_call_silently_wrong", "kind": "beyond", "verdict": "holds", "reason": "r",
             "deciding": {"max_abs_diff": 0.235}}
    page = html.render_html(path, tmp_path / "html", {"notebook": path.stem, "environment": {"transformers": "5.17.0"},
                                                      "claims": [claim]}).read_text()
    body = page.index("<body")
    title, verdict, ask = (page.index(t, body) for t in ("A title", "Verdict", "Ask:"))
    env, text, code = (page.index(t, body) for t in ("Environment this notebook ran with", "A long text", "print"))
    assert title < verdict < ask < text < env < code
    assert "silently wrong (max |logit diff| 0.235" in page[verdict:ask]


def test_a_missing_repro_file_is_said_not_hidden():
    src = sources.Source("x", "X", repro="examples/repro/none.py", repro_prints="a number", short="X")
    assert "is missing from this checkout" in "\n".join(first_screen.repro_block(src))


# --------------------------------------------------------------------------- the repros, each in a fresh interpreter

REPROS = [s for s in findings.sources().values() if s.repro]


@pytest.mark.parametrize("source", REPROS, ids=lambda s: s.key)
def test_each_repro_imports_only_torch_and_transformers(source):
    tree = ast.parse((ROOT / source.repro).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert mods - set(sys.stdlib_module_names) <= {"torch", "transformers"}, mods  # no third-party package besides them


def _fresh(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`code` in a new interpreter started in an empty folder, failing if anything of the kit was imported."""
    check = "import sys; assert not [m for m in sys.modules if m == 'helpers' or m.startswith('helpers.')]"
    return subprocess.run([sys.executable, "-c", f"{code}\n{check}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def _run_repro(key: str, tmp_path: Path, text: str | None = None) -> list[str]:
    path = ROOT / findings.sources()[key].repro
    done = _fresh(text if text is not None else f"import runpy; runpy.run_path({str(path)!r}, run_name='__main__')", tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _speaks(lines: list[str]) -> None:
    """Release first, expected and got, one verdict line last."""
    import transformers

    assert lines[0].startswith(f"transformers {transformers.__version__}, torch "), lines[0]
    assert any("expected" in ln for ln in lines) and any("got" in ln for ln in lines), lines
    assert lines[-1].startswith("verdict: ") and sum(ln.startswith("verdict: ") for ln in lines) == 1, lines


def test_the_control_repro_prints_release_expected_got_and_its_verdict(tmp_path):
    lines = _run_repro("control", tmp_path)
    _speaks(lines)
    assert lines[1].startswith("neither: expected first call input_ids [1, 0], fails; got [1, 0], fails: RuntimeError: "
                               "cannot reshape tensor of 0 elements"), lines[1]
    assert lines[2] == "mask_only: expected first call input_ids [1, 1], works; got [1, 1], works"
    assert lines[3].startswith("verdict: reproduces the control on transformers ")


@pytest.mark.e2e
def test_the_48947_repro_decides_its_cpu_part_on_cpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the drift runs too")
    lines = _run_repro("48947", tmp_path)
    _speaks(lines)
    assert lines[2] == "got: 7 of 7 prefetch reads unordered", "5.17.0 leaves the prefetch reads unordered"
    assert "race possible" in lines[-1] and "the drift itself needs CUDA" in lines[-1]


@pytest.mark.e2e
def test_the_48947_loop_runs_on_cpu_with_the_offloaded_arm_standing_in(tmp_path):
    """Every line of the CUDA path on CPU: cuda -> cpu, the offloaded cache -> the plain one (offloading needs CUDA
    streams), 4096 -> 64 tokens: the loop prints four steps, all 0, and 'no drift'."""
    text = (ROOT / findings.sources()["48947"].repro).read_text()
    for old, new in (('"cuda" if cuda else "cpu"', '"cpu"'), ('device="cuda"', 'device="cpu"'),
                     ("cuda = torch.cuda.is_available()", "cuda = True"), ("4096", "64"),
                     ("torch.bfloat16 if cuda else torch.float32", "torch.float32"),
                     ("DynamicCache(config=model.config, offloading=True) if offloading",
                      "DynamicCache(config=model.config) if offloading")):
        assert old in text, old
        text = text.replace(old, new)
    lines = _run_repro("48947", tmp_path, text)
    assert lines[-2:] == ["got: 0, 0, 0, 0", "verdict: no drift on transformers " + lines[0].split()[1].rstrip(",")
                          + "; 7 of 7 prefetch reads unordered in the CPU record"], lines


def test_a_new_source_fits_on_the_screen_too(tmp_path, monkeypatch):
    """Notebook 10 with a source of its own (claims its writer does not know, long reasons): the screen still fits,
    and a source more declared gives the screen one allowance more, no constant edited."""
    before = first_screen.screen_chars()
    monkeypatch.setitem(findings.sources(), "rollback", sources.Source("rollback", "Hybrid rollback", short="Hybrid rollback"))
    monkeypatch.setitem(findings.sources(), "zz-new", sources.Source("zz-new", "A new thread", short="A new thread"))
    assert first_screen.screen_chars() == before + first_screen.BLOCK_CHARS + first_screen.REPRO_CHARS
    fake_run(tmp_path)
    matrix(tmp_path)
    for folder in (tmp_path, tmp_path / "matrix" / "5.25.0"):
        data = json.loads((folder / "results" / "01_identity_reconstruction.json").read_text())
        data["notebook"] = "10_hybrid_rollback"
        data["claims"] = [{"id": f"rollback.c{i}", "kind": "beyond", "verdict": "holds", "reason": "x " * 150,
                           "evidence": {}, "deciding": {}} for i in range(6)]
        (folder / "results" / "10_hybrid_rollback.json").write_text(json.dumps(data))
    text = screen(tmp_path)
    assert "**Hybrid rollback**" in text and len(text) <= first_screen.screen_chars(), len(text)


def _rollback_claims(stale: bool, hand_len: int) -> list[tuple[str, dict]]:
    rec = {"id": "rollback.hybrid_recorded_crop_keeps_recurrent_state", "verdict": "holds" if stale else "fails",
           "deciding": {"stale_recurrent_diff": 0.0046 if stale else None,
                        "restored_modes": [] if stale else ["record_keep"]}}
    hand = {"id": "rollback.hand_rebuild_keeps_length", "verdict": "holds" if hand_len == 23 else "fails",
            "deciding": {"lengths": {"hand-written (layer methods)": hand_len}, "original_length": 23}}
    kit = {"id": "rollback.kit_rebuild_keeps_length", "verdict": "holds", "deciding": {}}
    return [("10_rollback_hybrid", c) for c in (rec, hand, kit)]


def test_the_rollback_ask_names_the_recording_mode_and_the_linear_count_from_what_was_measured(tmp_path):
    from helpers.rollback import ask as rollback_ask

    said = rollback_ask.ask({"5.17.0": _rollback_claims(True, 23), "5.25.0": _rollback_claims(False, 4)}, tmp_path)
    assert "leaves the recurrent state (off 0.0046) and is silently wrong on 5.17.0" in said.symptom, said.symptom
    assert "rolls back with `recurrent_states_to_keep=k` on 5.25.0" in said.symptom
    assert "a hand rebuild reports length 4 of 23 on 5.25.0" in said.symptom
    assert "`activate_past_recording(recurrent_states_to_keep=N)` where offered, else re-prefill" in said.ask and "`cumulative_length_linear`" in said.ask
    assert "make bisect NB=10 CLAIM=rollback.hand_rebuild_keeps_length GOOD=5.17.0 BAD=5.25.0" in said.ask
    # contradicting measurements: the length kept on both releases, no mode restored -> neither repair is advised
    same = rollback_ask.ask({"5.17.0": _rollback_claims(True, 23), "5.25.0": _rollback_claims(True, 23)}, tmp_path)
    assert "hand rebuild" not in same.symptom and "cumulative_length_linear" not in same.ask
    assert "recurrent_states_to_keep" not in same.ask and "make bisect" not in same.ask
    assert same.ask.startswith("re-prefill instead of `crop` on a hybrid (no way to roll its recurrent state back on "
                               "5.17.0 and 5.25.0)"), same.ask
