"""SUMMARY.md: counts per claim kind (only `reproduces` reads reproduced), one section per source, and paste
safety checked by rendering it as GitHub-flavoured Markdown (markdown-it-py, gfm-like preset with linkify)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.pipeline.report import claims_md, paste, sources, summary
from helpers.results import KINDS, VERDICTS

RUN_ID = "20261203T000000Z-sum0"
ENV = {"python": "3.11", "torch": "2.13.0", "transformers": "5.17.0", "device": "cpu", "cuda_available": False,
       "dtype": "float32", "model_id": "tiny-qwen3-vl", "model_revision": "r1"}
LONG_REASON = ("no CUDA device: the copy-stream race needs two CUDA streams and pinned host memory, which a CPU build of "
               "torch does not have; run `make gpu-check` on a machine with a GPU to decide this claim, and compare with "
               "the report's 2.1171875 at step 1 under bfloat16 on an RTX PRO 6000 Blackwell (this sentence is long on purpose).")


def claim(cid: str, kind: str, verdict: str, **extra) -> dict:
    return {"id": cid, "statement": f"statement of {cid}", "verdict": verdict, "reason": "why", "evidence": {"x": [1] * 50},
            "kind": kind, "deciding": {"value": 1.5}, "source": {"value": 7.66}, **extra}


def write(out: Path, notebook: str, claims: list[dict], **extra) -> None:
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{notebook}.json").write_text(json.dumps(
        {"notebook": notebook, "environment": ENV, "claims": claims, "measurements": {},
         "run": {"run_id": RUN_ID, "started": "2026-12-03T00:00:00Z"}, **extra}))


def run_record(out: Path, *notebooks: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"run_id": RUN_ID, "command": "run-all", "status": "complete",
                                              "started": "2026-12-03T00:00:00Z", "finished": "2026-12-03T00:01:00Z",
                                              "notebooks": {nb: {"status": "ok", "seconds": 1.0} for nb in notebooks}}))


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    nxt = re.search(r"^## ", text[start + len(heading):], re.M)
    return text[start: start + len(heading) + nxt.start()] if nxt else text[start:]


# --------------------------------------------------------------------------- counting per kind

def test_each_kind_is_counted_under_its_own_verdicts_and_only_reproduces_reads_reproduced():
    claims = [("05_x", claim(f"{kind}.{v}", kind, v)) for kind, pair in KINDS.items() for v in pair]
    claims += [("05_x", claim("refutes.mislabelled", "refutes", "reproduced")),  # a verdict foreign to its kind
               ("05_x", claim("sim.mislabelled", "simulation", "reproduced")),
               ("05_x", claim("env.skipped", "environment", "skipped")), ("05_x", claim("b.error", "beyond", "error"))]
    counts = claims_md.kind_counts(claims)
    assert counts["reproduces"] == {"reproduced": 1, "not_reproduced": 1}
    assert counts["refutes"] == {"refuted": 1, "not_refuted": 1, "other": 1}
    assert counts["simulation"] == {"holds": 1, "fails": 1, "other": 1}
    assert counts["environment"] == {"holds": 1, "fails": 1, "skipped": 1}
    assert counts["beyond"] == {"holds": 1, "fails": 1, "error": 1}
    assert claims_md.reproduced_count(counts) == 1  # the reproduces claim, nothing else


@pytest.mark.parametrize("kind", ["refutes", "beyond", "simulation", "environment"])
def test_no_other_kind_is_ever_counted_as_reproduced(tmp_path, kind):
    run_record(tmp_path, "05_x")
    holds = KINDS[kind][0]
    write(tmp_path, "05_x", [claim("a.claim", kind, holds), claim("b.claim", kind, "reproduced")])
    text = summary.build_summary(tmp_path)
    assert "0 of 0 source statement(s) reproduced" in text
    assert f"| {kind} |" in section(text, "## Counts per kind")
    assert f"1 {holds}" in section(text, "## Counts per kind") and "1 with a verdict foreign to the kind" in text
    assert "✅ reproduced" not in text


def test_any_verdict_of_any_kind_renders(tmp_path):
    run_record(tmp_path, "06_new")  # notebook 06's number: the triage source
    write(tmp_path, "06_new", [claim(f"c.{k}.{v}", k, v) for k in [*KINDS, "finding", "environment_check", "novel"]
                               for v in VERDICTS])
    text = summary.build_summary(tmp_path)
    assert "## Triage of a user's rebuild" in text and "| novel | unknown kind |" in text
    assert len(text) < paste.MAX_CHARS


# --------------------------------------------------------------------------- one section per source

def test_one_section_per_source_each_opening_with_its_count_and_what_was_not_tested_and_the_setup_gap(tmp_path):
    run_record(tmp_path, "01_a", "05_b", "06_c", "07_d")
    write(tmp_path, "01_a", [claim("a.one", "reproduces", "reproduced"), claim("a.new", "beyond", "holds")])
    write(tmp_path, "05_b", [claim("b.refuted", "refutes", "refuted"), claim("b.sim", "simulation", "holds"),
                             {**claim("b.cuda", "reproduces", "skipped"), "reason": LONG_REASON}])
    write(tmp_path, "06_c", [claim("c.tree", "beyond", "holds")])
    write(tmp_path, "07_d", [claim("d.reg", "reproduces", "not_reproduced")])
    text = summary.build_summary(tmp_path)
    heads = re.findall(r"^## (.+)$", text, re.M)
    control, issue, triage = (h for h in heads if h.startswith(("The Qwen3-VL", "transformers issue", "Triage")))
    assert heads.index(control) < heads.index(issue) < heads.index(triage)
    assert issue == "transformers issue `#48947`: hybrid offloading drift"
    c = section(text, f"## {control}")
    assert "`a.one`" in c and "`d.reg`" in c and "`b.sim`" not in c  # 01 and 07 answer the control
    opening = [line for line in c.splitlines() if line.startswith("- **")][:2]
    assert [line.split(":**")[0] for line in opening] == ["- **Counted", "- **Not tested here"]
    assert opening[0] == ("- **Counted:** reproduced 1 of 2 on 5.17.0 (statements tested); the kit's own checks hold "
                          "1 of 1 on 5.17.0.")  # the pages' count line (verdict_line.count_line)
    assert "| dtype | float16 | float32 | differs |" in c and "| release | 5.14.1 | 5.17.0 | differs |" in c
    assert "Gap: release 5.17.0 instead of 5.14.1; dtype float32 instead of float16" in c
    b = section(text, f"## {issue}")
    assert "- **Counted:** 1 not tested here (needs CUDA); hypothesis `b.refuted` refuted (why); apart: 1 simulation(s)." in b
    assert "| release | 5.17.0 | 5.17.0 | same |" in b and "| dtype | bfloat16 | float32 | differs |" in b
    assert "1 claim(s) skipped or in error (reasons below)" in b
    assert f"- `b.cuda` ⏭️ skipped: {paste.code_refs(LONG_REASON)}" in b  # the reason whole, never cut
    assert "`c.tree`" in section(text, f"## {triage}")


def test_a_notebook_answers_its_findings_source_and_an_undeclared_one_is_refused():
    assert sources.source_of("07_regression_list").key == "control"
    assert sources.source_of("05_hybrid_offloading_drift").key == "48947"
    assert sources.source_of("06_rebuild_triage").key == "triage"
    with pytest.raises(KeyError, match="no finding declares notebook 42_unknown"):
        sources.source_of("42_unknown")


def test_notes_and_captured_warnings_are_listed_once(tmp_path):
    run_record(tmp_path, "01_a", "05_b")
    warning = "`causal_conv1d_fn` is falling back to the torch implementation"
    write(tmp_path, "01_a", [claim("a.one", "reproduces", "reproduced", notes=["6 = 3 caches x 2 argument sets"])],
          warnings=[warning])
    write(tmp_path, "05_b", [claim("b.one", "reproduces", "reproduced")], warnings=[warning])
    text = summary.build_summary(tmp_path)
    assert "- `a.one`: 6 = 3 caches x 2 argument sets" in text
    assert "| 01 | `a.one` | reproduces | ✅ reproduced | value=1.5 (note below) | no quote registered (value=7.66) |" in text
    assert text.count("causal_conv1d_fn") == 1 and "_(notebooks 01, 05)_" in section(text, "## Environment")


# --------------------------------------------------------------------------- paste safety, rendered as GFM

def test_code_refs_puts_references_mentions_and_urls_in_code_spans():
    assert paste.code_refs("see #35168, NVIDIA/kvpress#16 and PR #39843.") == \
        "see `#35168`, `NVIDIA/kvpress#16` and PR `#39843`."
    assert paste.code_refs("cc @Cyrilvallez (and @a-b)") == "cc `@Cyrilvallez` (and `@a-b`)"
    assert paste.code_refs("at https://x.org/a and www.x.org") == "at `https://x.org/a` and `www.x.org`"
    assert paste.code_refs("already `#1` and `@x`; 3 # 4; a#b") == "already `#1` and `@x`; 3 # 4; a#b"


def _gfm(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("gfm-like").render(text)  # tables, strikethrough, linkify (linkify-it-py)


def _md_tables(text: str) -> list[list[str]]:
    blocks, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    return blocks


def test_the_summary_renders_as_gfm_with_no_link_no_mention_no_cut_cell(tmp_path):
    run_record(tmp_path, "01_a", "05_b")
    refs = "like #35168 and NVIDIA/kvpress#16, PR #39843; cc @Cyrilvallez; https://github.com/x/y www.example.org"
    write(tmp_path, "01_a", [{**claim("a.one", "reproduces", "reproduced", notes=[f"note {refs}"]), "statement": f"s {refs}",
                              "reason": f"r {refs}", "deciding": {"see": "#36151", "who": "@rocket", "list": [1, 0],
                                                                  "blob": {"a": {"b": [1, 2, 3]}}, "long": "word " * 30}}])
    write(tmp_path, "05_b", [{**claim("b.one", "reproduces", "skipped"), "reason": f"{LONG_REASON} {refs}"}])
    text = summary.build_summary(tmp_path)
    html = _gfm(text)
    assert "<a " not in html, re.findall(r"<a [^>]*>[^<]*</a>", html)
    outside_code = re.sub(r"<code[^>]*>.*?</code>", "", html, flags=re.S)  # spans and the repros' python blocks
    assert not re.search(r"(?<![\w&])#\d", outside_code), "an issue reference outside a code span"
    assert not re.search(r"(?<![\w`])@\w", outside_code), "an @mention outside a code span"
    prose = re.sub(r"^```python\n.*?^```$", "", text, flags=re.S | re.M)
    assert "…" not in prose and "{\"" not in prose and "{'" not in prose, "a cut cell or a JSON blob"
    tables = _md_tables(text)
    assert html.count("<table>") == len(tables) >= 5
    for rendered, block in zip(re.findall(r"<table>.*?</table>", html, re.S), tables):
        head = len(re.findall(r"<th\b", rendered))
        assert head == block[0].count("|") - 1 - block[0].count("\\|")
        for row in re.findall(r"<tr>(.*?)</tr>", rendered, re.S)[1:]:
            assert len(re.findall(r"<td\b", row)) == head, row
    assert html.count("<details>") == text.count("<details>") == text.count("</details>") >= 2
    assert "<summary>" in html
    assert LONG_REASON.split(";")[0] in text and "(this sentence is long on purpose)." in text
    assert len(text) < paste.MAX_CHARS <= paste.GITHUB_LIMIT - 5000


def test_a_value_close_to_an_integer_is_not_rounded_onto_it():
    assert paste.fmt_scalar(0.9997308850288391) == "0.999731" and paste.fmt_scalar(1.0) == "1"
    assert paste.fmt_scalar(0.5218) == "0.522" and paste.fmt_scalar(4.17e-07) == "4.17e-07"


def test_the_gap_names_this_runs_logit_scale(tmp_path):
    run_record(tmp_path, "04_a")
    write(tmp_path, "04_a", [{**claim("a.one", "reproduces", "reproduced"), "evidence": {"noise_scale": 0.9312}}])
    assert "The largest |logit| in this run is 0.931: raw differences are on that scale." in summary.build_summary(tmp_path)


def test_text_set_in_code_spans_cannot_break_out_of_them(tmp_path):
    run_record(tmp_path, "01_a")
    data = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**data, "parameters": {"rebuild": "`x` @mallory #99 a|b"}}))
    write(tmp_path, "01_a", [claim("odd.`id`#7", "reproduces", "skipped")])
    html = _gfm(summary.build_summary(tmp_path))
    outside_code = re.sub(r"<code>.*?</code>", "", html, flags=re.S)
    assert "@mallory" not in outside_code and "#99" not in outside_code and "#7" not in outside_code
    assert "<a " not in html
