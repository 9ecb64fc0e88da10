"""End-to-end: every notebook in notebooks/ runs through papermill on the tiny defaults, and its
claims come out as the issues say on the pinned release. Also checks the notebooks' shared shape."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from helpers import findings
from helpers.offload import gpu
from helpers.results import verdict_for

from helpers.pipeline.run import batch, execute
from helpers.pipeline.tools import colab
from helpers.pipeline.paths import repo_root
from inprocess import run_one  # tests/ is on sys.path

from tinyfacts import NOT_ON_TINY  # noqa: E402 - tests/ is on sys.path

ROOT = repo_root()
CUDA_ONLY = {"offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
             "offload.ordering_edge_removes_drift", "offload.race_observed_on_device", "offload.offload_event_removes_drift",
             "offload.record_stream_removes_drift", "offload.block_overwritten_under_pending_read", "offload.unlagged_run_drifts",
             "regress.flash_attention_2_matches_sdpa"}
CPU_ONLY = {"offload.cpu_reports_cuda_requirement"}  # decided only where CUDA is absent
ENVIRONMENT_CHECKS = {"offload.cpu_reports_cuda_requirement"}  # facts about the machine, never findings
EXPECTED_CLAIMS = {f.stem: set(f.claims) for f in findings.found()}  # each notebook's claims, as its finding declares them
# Kinds declared by notebooks 01-04 (every other claim of theirs is `reproduces`: a statement of the control).
KINDS_01_04 = {"rope.fresh_instance_diverges": "beyond", "rope.restored_state_matches": "beyond"}
SOURCES = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _run_all(out: Path, **params) -> list[execute.RunResult]:
    os.environ["KVKIT_OUTPUT_DIR"] = str(out)
    try:
        return batch.run_all(params or None)
    finally:
        del os.environ["KVKIT_OUTPUT_DIR"]


def _results(out: Path, stem: str) -> dict:
    return json.loads((out / "results" / f"{stem}.json").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    _run_all(out)
    return out


def test_every_notebook_is_run_by_run_all_and_by_this_test():
    assert SOURCES, "no notebooks"
    assert [p.name for p in execute.notebooks()] == [p.name for p in SOURCES]
    make = subprocess.run(["make", "-n", "run-all"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "helpers.pipeline.run run-all" in make
    assert {p.stem for p in SOURCES} == set(EXPECTED_CLAIMS), "every notebook and only they declare a finding"


@pytest.mark.e2e
@pytest.mark.parametrize("stem", [p.stem for p in SOURCES])
def test_notebook_runs_and_its_claims_hold(run, stem):
    assert (run / "notebooks" / f"{stem}.ipynb").exists()
    data = _results(run, stem)
    verdicts = {c["id"]: c["verdict"] for c in data["claims"]}
    assert set(verdicts) == EXPECTED_CLAIMS[stem]
    kinds = {c["id"]: c.get("kind") for c in data["claims"]}
    assert {cid for cid, kind in kinds.items() if kind == "environment"} == ENVIRONMENT_CHECKS & set(kinds)
    if stem[:2] in ("01", "02", "03", "04"):
        assert kinds == {cid: KINDS_01_04.get(cid, "reproduces") for cid in kinds}
    for claim_id, verdict in verdicts.items():
        cuda = data["environment"]["cuda_available"]
        if (claim_id in CUDA_ONLY and not cuda) or (claim_id in CPU_ONLY and cuda):
            assert verdict == "skipped", claim_id
        elif claim_id in NOT_ON_TINY:  # measured as a rate over the prompts; the real checkpoint decides it
            claim = next(c for c in data["claims"] if c["id"] == claim_id)
            assert verdict == "skipped" and "decides it by chance" in claim["reason"], claim
            assert claim["evidence"]["refeed_rate"]["ran"] >= 30, claim
        else:
            expected = verdict_for(kinds[claim_id], True)  # the kind's holding verdict
            assert verdict == expected, (claim_id, [c for c in data["claims"] if c["id"] == claim_id])
    for key in ("python", "torch", "transformers", "device", "dtype", "attn_implementation", "model_id", "model_revision", "seed"):
        assert data["environment"][key] is not None, key
    assert list((run / "figures").glob(f"{stem}-*.png")), "no figure"


@pytest.mark.e2e
def test_the_whole_runs_summary_is_not_truncated_and_its_first_screen_fits(run):
    """Every notebook's claims in one SUMMARY.md under the paste limit with nothing cut; the first screen fits with a
    Verdict and an Ask line per source (the repros folded right below it)."""
    from helpers.pipeline.report import first_screen, paste, summary

    text = summary.build_summary(run)
    assert "**Truncated:**" not in text and len(text) < paste.MAX_CHARS - 4000, len(text)  # room for a real run's warnings
    screen = summary.first_screen_of(text)
    assert len(screen) <= first_screen.screen_chars() and "```python" not in screen, len(screen)
    assert sum(line.startswith("- Ask: ") for line in screen.splitlines()) >= 3, screen


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU verdicts")
def test_05_on_cpu_skips_the_cuda_claims_and_decides_the_record(run):
    """Notebook 05 on CPU (the shared run): every CUDA claim skipped saying so; the record's claims decided."""
    claims = {c["id"]: c for c in _results(run, "05_hybrid_offloading_drift")["claims"]}
    for cid in gpu.CUDA_CLAIMS:
        assert claims[cid]["verdict"] == "skipped" and "CUDA" in claims[cid]["reason"], cid
    # the report's hypothesis (only the linear layers' state looks broken) is refuted; the unordered copy is the kit's own
    assert (claims["offload.linear_layers_never_moved"]["kind"], claims["offload.linear_layers_never_moved"]["verdict"]) == (
        "refutes", "refuted")
    assert (claims["offload.prefetch_reads_unordered_copy"]["kind"], claims["offload.prefetch_reads_unordered_copy"]["verdict"]) == (
        "beyond", "holds")
    assert claims["offload.race_replay_drifts_by_construction"]["kind"] == "simulation"
    for cid in ("offload.race_not_specific_to_hybrid", "offload.report_loop_reads_previous_forward",
                "offload.generate_orders_cross_forward_reads", "offload.prefetched_block_released_with_pending_read"):
        assert claims[cid]["kind"] == "beyond" and claims[cid]["verdict"] == "holds", cid
    assert claims["offload.linear_layers_never_moved"]["evidence"]["linear_offloads"] == 0
    env = claims["offload.cpu_reports_cuda_requirement"]
    assert env["kind"] == "environment" and env["verdict"] in ("holds", "fails") and env["evidence"]["exception_type"]
    for name in ("schedule", "replay-drift", "replay-stale"):
        assert (run / "figures" / f"05_hybrid_offloading_drift-{name}.png").exists()


@pytest.mark.e2e
def test_06_decides_its_claims(run):
    """Notebook 06 on the tiny default (the shared run): its claims, every built-in's leaf and repairs."""
    data = _results(run, "06_rebuild_triage")
    assert {c["id"]: (c["kind"], c["verdict"]) for c in data["claims"]} == {
        "triage.identity_matches_original": ("reproduces", "reproduced"),
        "triage.streaming_generate_uses_retained_length": ("beyond", "holds"),
        "triage.per_layer_lengths_outcome": ("beyond", "holds"), "triage.per_layer_lengths_by_backend": ("beyond", "holds")}
    assert {n: v["branch"] for n, v in data["measurements"]["triage"].items()} == {
        "identity": "no_defect", "streaming": "compression_positions_and_loss", "int8": "reconstruction_copy",
        "per_layer": "compression_positions_and_loss", "crop_short": "prefix_short", "reused_no_copy": "extra_slots"}
    assert data["measurements"]["triage"]["streaming"]["repairs"][-1]["name"] == "continue_at_processed_length"
    assert [(r["name"], r["restores"]) for r in data["measurements"]["triage"]["crop_short"]["repairs"]] == [
        ("full_mask", False), ("refeed_whole_ids", True)]
    assert data["measurements"]["triage"]["reused_no_copy"]["repairs"][-1] | {"max_abs_diff": 0} == {
        "name": "crop_to_processed", "max_abs_diff": 0, "restores": True}
    short = {r["state"]: r for r in data["measurements"]["control0_resume_state"]["crop_short"]}
    assert short["layer 0 slots by content (vs the original's)"]["rebuilt"].endswith("missing 80 (last)")
    assert data["measurements"]["triage"]["identity"]["repairs"] == [
        {"name": "full_mask", "max_abs_diff": data["measurements"]["triage"]["identity"]["repairs"][0]["max_abs_diff"],
         "restores": True}]
    control0 = {r["state"]: r for r in data["measurements"]["control0_resume_state"]["streaming"]}
    assert control0["layer 0 stored slots"]["rebuilt"] == "20" and control0["layer 0 stored slots"]["differs"] == "<<"
    assert data["measurements"]["triage_tree"]["identity"].startswith("rebuild 'identity': no defect")
    positions = {r["rebuild"]: r for r in data["measurements"]["control3_logical_positions"]}
    assert positions["streaming"]["positions_include_rope_deltas"] and positions["streaming"]["rope_deltas"] == -42
    assert positions["streaming"]["explicit_position_logical"] == 81
    assert "[x]" in data["measurements"]["triage_tree"]["streaming"]
    assert (run / "figures" / "06_rebuild_triage-branches.png").exists()
    assert str(ROOT) not in (run / "results" / "06_rebuild_triage.json").read_text()


@pytest.mark.e2e
def test_two_cpu_runs_give_identical_numbers(run, tmp_path):
    again = tmp_path / "again"
    os.environ["KVKIT_OUTPUT_DIR"] = str(again)
    try:
        assert run_one(SOURCES[1]).ok  # 02: the mask/position matrix, every call's logits compared
    finally:
        del os.environ["KVKIT_OUTPUT_DIR"]
    def same(data: dict) -> dict:  # the run record (id, times, commit) differs by design
        return {k: v for k, v in data.items() if k != "run"}

    assert same(_results(again, SOURCES[1].stem)) == same(_results(run, SOURCES[1].stem))


@pytest.mark.e2e
def test_failing_notebook_does_not_stop_the_others(tmp_path):
    os.environ["KVKIT_OUTPUT_DIR"] = str(tmp_path)
    try:
        bad = run_one(SOURCES[0], {"model_id": "tiny-does-not-exist"})
    finally:
        del os.environ["KVKIT_OUTPUT_DIR"]
    assert not bad.ok and "ModelUnavailableError" in bad.error
    assert (tmp_path / "notebooks" / SOURCES[0].name).exists()  # the partial copy is written
    claims = _results(tmp_path, SOURCES[0].stem)["claims"]
    assert {c["verdict"] for c in claims} == {"error"} and "tiny-qwen3-vl" in claims[0]["reason"]


TEXT_ONLY = ["02_mask_position_matrix", "04_token_boundary_double_processing"]


@pytest.fixture(scope="module")
def text_only_run(tmp_path_factory) -> Path:
    """02 and 04 on a local text-only Qwen3 folder, as one recorded run (one warm process for both)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tmp = tmp_path_factory.mktemp("text-only")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    Qwen3ForCausalLM(config).save_pretrained(tmp / "text-lm")
    os.environ["KVKIT_OUTPUT_DIR"] = str(tmp / "out")
    try:
        results = batch.run_all({"model_id": str(tmp / "text-lm")}, paths=[ROOT / "notebooks" / f"{s}.ipynb" for s in TEXT_ONLY])
    finally:
        del os.environ["KVKIT_OUTPUT_DIR"]
    assert [r.ok for r in results] == [True] * len(TEXT_ONLY), [r.error for r in results]
    return tmp / "out"


@pytest.mark.e2e
@pytest.mark.parametrize("stem", TEXT_ONLY)
def test_text_only_model(text_only_run, stem):
    claims = _results(text_only_run, stem)["claims"]
    verdicts = {c["verdict"] for c in claims if c["id"] not in NOT_ON_TINY}
    assert verdicts <= {"reproduced", "skipped"} and "reproduced" in verdicts, claims
    assert {c["verdict"] for c in claims if c["id"] in NOT_ON_TINY} <= {"reproduced", "not_reproduced"}


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_shape(path):
    raw = json.loads(path.read_text())["cells"]
    assert all(c.get("id") for c in raw) and len({c["id"] for c in raw}) == len(raw), "every cell has a unique id"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit notebooks with outputs cleared"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    title = nb.cells[0].source
    assert "Source" in title and not re.search(r"Last run on", title), "the environment is printed, never typed"
    assert "shared/seeds" not in "\n".join(c.source for c in nb.cells), "cite sources by their public names"
    assert code[0].source == colab.cell_source(), "the Colab cell is stale: run `make generate` (see docs/adding-a-finding.md)"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] is code[1] and "model_id" in tagged[0].source
    text = "\n".join(c.source for c in code)
    assert "sys.path" not in text and "trust_remote_code = False" in text
    assert not re.search(r"""verdict\s*=\s*["'](reproduced|not_reproduced)""", text)
    assert "savefig" not in text, "figures go through helpers.plots"


def test_colab_cell_and_badges_read_the_one_repository_address():
    repo = colab.repository_url()
    assert repo.startswith("https://github.com/")
    cell = colab.cell_source()
    assert 'if "google.colab" in sys.modules' in cell and f'os.environ.get("KVKIT_REPO", "{repo}")' in cell
    assert "requirements-runtime.txt" in cell and 'packages", "kvresume"), kit' in cell and "requirements.txt" not in cell
    assert colab.cell_source("https://github.com/fork/kit") != cell  # the cell is rendered from the address
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert colab.render_readme(readme) == readme, "README badges are stale: run `make generate` (see docs/adding-a-finding.md)"
    for path in SOURCES:
        row = next((line for line in readme.splitlines() if line.startswith(f"| [{path.stem}]")), "")
        assert colab.badge(path.stem, repo) in row, f"{path.stem}: its README row needs the Colab badge"
