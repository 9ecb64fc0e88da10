"""The built-ins and the examples land where docs/triage.md's measured table says, with its repair numbers."""
from __future__ import annotations

import re

import pytest

from kvresume import compat
from helpers.pipeline.paths import repo_root
from helpers.triage import rebuilds
from helpers.triage import run as triage_run

DOC = repo_root() / "docs" / "triage.md"
EXAMPLE = "examples/my_rebuild.py"


def measured_rows() -> dict[str, tuple[str, dict[str, float]]]:
    """{spec: (leaf, {repair: number})} from the table under 'Measured (tiny Qwen3-VL default ...)'."""
    text = DOC.read_text()
    table = text[text.index("### Measured (tiny Qwen3-VL default"):]
    table = table[:table.index("\n\n", table.index("| rebuild |"))]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        spec = cells[0].split("`")[1]
        leaf = cells[4].split("`")[1]
        numbers = {name: float(v) for name, v in re.findall(r"([a-z_]+) ([0-9.]+(?:e-?\d+)?)", cells[3])}
        out[spec] = (leaf, numbers)
    return out


def test_the_doc_table_lists_every_builtin_and_the_assignment_rebuild():
    rows = measured_rows()
    assert set(rebuilds.BUILTINS) <= set(rows) and f"{EXAMPLE}:assign_layers" in rows
    assert rows[f"{EXAMPLE}:assign_layers"][0] == "cache_metadata"


def test_builtins_and_examples_land_where_the_docs_say(bundle, prompt):
    rows = measured_rows()
    compat.set_rope_state(bundle.model, None)
    base = triage_run.prepare(bundle, prompt)
    specs = {"identity": rebuilds.load("identity")}
    for spec in rows:
        if spec != "identity":
            specs[rebuilds.label(spec)] = rebuilds.load(spec, 4, 16)
    results = triage_run.triage_all(base, triage_run.apply_all(base, specs))
    for spec, (leaf, numbers) in rows.items():
        verdict = results[rebuilds.label(spec)].verdict
        assert verdict["branch"] == leaf, spec
        got = {r["name"]: r["max_abs_diff"] for r in verdict["repairs"]}
        for name, value in numbers.items():
            if name in got:  # the table's repair numbers, as rounded there
                # below 1e-6 a number is the float32 noise floor, which differs between CPUs (6.6e-7 here, 4.2e-7 in the table)
                assert got[name] == pytest.approx(value, rel=0.06, abs=1e-6 if value < 1e-6 else 2e-7), (spec, name)
        assert set(numbers) & set(got), (spec, "no repair number of the table was tried")
