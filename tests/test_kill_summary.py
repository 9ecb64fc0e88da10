"""Kill tests for SUMMARY.md's tally (make mutants: helpers/pipeline/report/claims_md.py counting, summary.missing_notebooks):
a skipped finding, an error, a verdict foreign to its kind and a missing verdict each land where they belong."""
from __future__ import annotations

from helpers.pipeline.report import claims_md
from helpers.pipeline.report import summary


def claim(verdict: str | None, kind: str | None = "reproduces", **kw) -> tuple[str, dict]:
    c = {"id": f"x.{verdict}", **({"verdict": verdict} if verdict is not None else {}),
         **({"kind": kind} if kind is not None else {}), **kw}
    return ("01_x", c)


CLAIMS = [claim("reproduced"), claim("reproduced"), claim("not_reproduced"), claim("skipped"), claim("error"),
          claim("refuted", "refutes"), claim("holds", "refutes"), claim("holds", "simulation"), claim("fails", "beyond"),
          claim("skipped", "environment"), claim(None), claim("reproduced", None), claim("reproduced"),
          claim("holds", "mystery")]


def test_kind_counts_put_every_verdict_in_its_place():
    counts = claims_md.kind_counts(CLAIMS)
    assert counts == {"reproduces": {"reproduced": 4, "not_reproduced": 1, "skipped": 1, "error": 2},
                      "refutes": {"refuted": 1, "other": 1}, "simulation": {"holds": 1}, "beyond": {"fails": 1},
                      "environment": {"skipped": 1}, "mystery": {"other": 1}}
    assert claims_md.reproduced_count(counts) == 4 and claims_md.reproduced_count({}) == 0
    assert claims_md.reproduced_count({"refutes": {"reproduced": 3}}) == 0, "only kind reproduces counts"


def test_headline_counts_the_skipped_finding_and_the_errors():
    counts = claims_md.kind_counts(CLAIMS)
    assert claims_md.headline(counts, 3) == ("**4 of 8 source statement(s) reproduced** (3 notebook(s), 14 claim(s), "
                                             "4 skipped or in error).")
    one_skip = claims_md.kind_counts([claim("reproduced"), claim("skipped")])
    assert "**1 of 2 source statement(s) reproduced** (1 notebook(s), 2 claim(s), 1 skipped" in claims_md.headline(one_skip, 1)
    assert "**0 of 0 source statement(s) reproduced** (0 notebook(s), 0 claim(s), 0 skipped" in claims_md.headline({}, 0)


def test_counts_table_rows():
    rows = claims_md.counts_table(claims_md.kind_counts(CLAIMS))
    assert rows[:2] == ["| kind | what it is | holds | does not hold | skipped | error |", "|---|---|---|---|---|---|"]
    assert rows[2] == "| reproduces | the source states it | 4 reproduced | 1 not_reproduced | 1 | 2 |"
    assert rows[3] == ("| refutes | a hypothesis the source puts forward, tested | 1 refuted | 0 not_refuted | 0 | 0"
                       " + 1 with a verdict foreign to the kind |")
    assert rows[4].startswith("| beyond |") and rows[4].endswith("| 0 holds | 1 fails | 0 | 0 |")
    assert rows[5].startswith("| simulation |") and rows[6].endswith("| 0 holds | 0 fails | 1 | 0 |")
    assert rows[7] == "| mystery | unknown kind | 0 ? | 0 ? | 0 | 0 + 1 with a verdict foreign to the kind |"
    assert len(rows) == 8
    empty = claims_md.counts_table({})
    assert empty[2:] == ["| reproduces | the source states it | 0 reproduced | 0 not_reproduced | 0 | 0 |"]


def test_undecided_lists_skipped_and_error_claims_only():
    lines = claims_md.undecided([claim("skipped", reason="no CUDA"), claim("reproduced"), claim("error", reason="boom")])
    assert lines == ["Not decided in this run:", "", "- `x.skipped` ⏭️ skipped: no CUDA", "- `x.error` ⚠️ error: boom", ""]
    assert claims_md.undecided([claim("reproduced")]) == []
    two = [("05", {"id": f"x.s{i}", "kind": "reproduces", "verdict": "skipped", "reason": "no CUDA"}) for i in range(2)]
    assert claims_md.undecided(two) == ["Not decided in this run:", "", "- `x.s0`, `x.s1` ⏭️ skipped: no CUDA", ""]
    assert claims_md.undecided([claim("error")]) == ["Not decided in this run:", "", "- `x.error` ⚠️ error: ", ""]


def test_marks():
    assert claims_md.mark("refutes", "refuted") == "✅" and claims_md.mark("refutes", "not_refuted") == "❌"
    assert claims_md.mark("refutes", "reproduced") == "⚠️" and claims_md.mark("beyond", "skipped") == "⏭️"
    assert claims_md.mark("nokind", "holds") == "⚠️"


def test_a_missing_results_file_is_listed_with_why():
    run = {"notebooks": {"01_a": {"status": "ok"}, "02_b": {"status": "ok"}, "03_c": {"status": "interrupted"},
                         "04_d": {"status": "failed", "error": "boom"}, "05_e": None, "06_f": {"status": "not_started"}}}
    lines = summary.missing_notebooks([{"notebook": "01_a"}], run)
    assert lines == ["## Notebooks without results", "",
                     "- `02_b` ⚠️ error: no results file from this run: the notebook ran but wrote no results file",
                     "- `03_c` ⚠️ error: no results file from this run: interrupted",
                     "- `04_d` ⚠️ error: no results file from this run: boom",
                     "- `05_e` ⚠️ error: no results file from this run: notebook failed",
                     "- `06_f` ⚠️ error: no results file from this run: not started", ""]
    assert summary.missing_notebooks([{"notebook": "01_a"}], {"notebooks": {"01_a": {"status": "ok"}}}) == []
    assert summary.missing_notebooks([], {}) == [] and summary.missing_notebooks([], {"notebooks": None}) == []
