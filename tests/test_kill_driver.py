"""make mutants' driver (helpers/pipeline/tools/mutants.py): its SCOPE (mutant_scope.py) names real modules,
functions and test files, so a renamed decision cannot silently drop out of mutation testing; the generated mutmut
config and the report."""
from __future__ import annotations

import ast
import fnmatch
import json
from pathlib import Path

import pytest

from helpers.pipeline.tools import mutants
from helpers.pipeline.paths import repo_root

ROOT = repo_root()


def functions(module: str) -> set[str]:
    """Top-level functions and Class.method names of a module."""
    tree = ast.parse((ROOT / module).read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{n.name}" for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


@pytest.mark.parametrize("scope", mutants.SCOPE, ids=[s.module for s in mutants.SCOPE])
def test_every_scoped_pattern_names_a_function_and_every_test_exists(scope):
    assert (ROOT / scope.module).is_file()
    defined = functions(scope.module)
    for pattern in scope.functions:
        assert fnmatch.filter(sorted(defined), pattern), f"{scope.module}: {pattern!r} matches no function"
    for test in scope.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        assert not name or f"def {name}(" in (ROOT / path).read_text(), test


def test_every_registered_decision_module_is_mutated():
    from helpers import findings

    scoped = {s.dotted: s for s in mutants.SCOPE}
    for d in findings.decisions():
        assert d.dotted in scoped, d.module
        for name in findings.decision_functions(d):
            module = d.dotted
            assert any(fnmatch.fnmatchcase(name, p) for p in scoped[module].functions), (module, name)


def test_patterns_are_mutmut_names():
    s = mutants.Scope("helpers/offload/streams.py", ("join", "StreamLog.*"), ())
    assert s.dotted == "helpers.offload.streams"
    assert s.patterns() == ["helpers.offload.streams.x_join__mutmut_*", "helpers.offload.streams.xǁStreamLogǁ*__mutmut_*"]
    assert s.covers("helpers.offload.streams.x_join__mutmut_3") and s.covers("helpers.offload.streams.xǁStreamLogǁbegin__mutmut_1")
    assert not s.covers("helpers.offload.streams.x__stand_ins__mutmut_1")
    assert not s.covers("helpers.offload.streams.xǁRecStreamǁsynchronize__mutmut_1")
    assert mutants.Scope("helpers/families/__init__.py", ("*",), ()).dotted == "helpers.families"


def test_the_generated_config_runs_fast_tests_only():
    cfg = mutants.mutmut_config(mutants.SCOPE[:2])
    assert cfg.startswith("[mutmut]\nsource_paths =\n    helpers\n    kvresume\nonly_mutate =\n    helpers/compare.py\n"
                          "    helpers/results.py\n")
    assert "    -m\n    not e2e\n" in cfg and "tests/test_kill_compare.py" in cfg and "tests/test_decisions.py" in cfg
    assert "tests/test_triage.py\n" not in mutants.mutmut_config(mutants.SCOPE), "only the tree's own tests of test_triage"


def test_a_package_module_is_mutated_where_its_import_name_is_its_path():
    """kvresume's modules are mutated as work/kvresume/x.py: mutmut names a mutant after its path, the tests import
    `kvresume.x` (packages/kvresume/kvresume/x.py would give packages.kvresume.kvresume.x and no test would run)."""
    scope = mutants.select(["kvresume/ledger.py"])
    assert [s.work_path for s in scope] == ["kvresume/ledger.py"] and scope[0].covers("kvresume.ledger.x_ledger_of__mutmut_1")
    assert "    kvresume/ledger.py\n" in mutants.mutmut_config(scope)
    assert not scope[0].covers("packages.kvresume.kvresume.ledger.x_ledger_of__mutmut_1")


def test_select_and_report(tmp_path, capsys):
    assert mutants.select(None) == mutants.SCOPE and [s.module for s in mutants.select(["tree"])] == ["helpers/triage/tree.py"]
    with pytest.raises(SystemExit):
        mutants.select(["no_such_module"])
    scope = mutants.Scope("helpers/compare.py", ("ulp",), ())
    meta = tmp_path / "mutants" / "helpers" / "compare.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {f"helpers.compare.x_ulp__mutmut_{i}": 1 for i in range(1, 10)} | {"helpers.compare.x_ulp__mutmut_10": 0,
                                                                               "helpers.compare.x_dtype_eps__mutmut_1": 0}
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "compare.py").write_text("def ulp(x):\n    return x\n")
    ok, rows = mutants.report(tmp_path, [scope])
    out = capsys.readouterr().out
    assert ok and rows == [{"module": "helpers/compare.py", "killed": 9, "total": 10, "ratio": 0.9}]
    assert "ok   helpers/compare.py: 9/10 killed (90.0%)" in out and "survived: helpers/compare.py:? x_ulp__mutmut_10" in out
    codes["helpers.compare.x_ulp__mutmut_9"] = 33  # no tests: not killed
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    ok, rows = mutants.report(tmp_path, [scope])
    assert not ok and rows[0]["killed"] == 8 and "FAIL helpers/compare.py: 8/10" in capsys.readouterr().out
    ok, _ = mutants.report(tmp_path, [mutants.Scope("helpers/identity/decisions.py", ("x",), ())])
    assert not ok, "a module without mutants fails: nothing was tested"
