"""Kill tests for the bisect search (make mutants: helpers/pipeline/bisect/search.py) on fake per-release values: the
exact probe order, the run count, value identity, skipped releases at each end and in the middle, an interrupt."""
from __future__ import annotations

from helpers.pipeline.bisect.search import Interrupted, Probe, Search, find_changes, same

R = [f"r{i}" for i in range(9)]  # r0 .. r8, in release order


def prober(values: dict[str, object], broken: dict[str, str] | None = None, failed: dict[str, str] | None = None):
    calls: list[str] = []

    def probe(release: str) -> Probe:
        calls.append(release)
        if release in (broken or {}):
            return Probe(release, ok=False, reason=f"not installable: {broken[release]}")
        if release in (failed or {}):
            return Probe(release, ok=False, reason=f"notebook failed: {failed[release]}")
        return Probe(release, values[release], seconds=1.0)
    return probe, calls


def step(at: int, before: object = "a", after: object = "b") -> dict[str, object]:
    return {r: before if i < at else after for i, r in enumerate(R)}


def test_the_probe_order_halves_with_the_lower_middle():
    probe, calls = prober(step(5))
    search = find_changes(R, probe)
    assert calls == ["r0", "r8", "r4", "r6", "r5"] and search.changes == [("r4", "r5")]
    probe, calls = prober(step(1))
    assert find_changes(R, probe).changes == [("r0", "r1")] and calls == ["r0", "r8", "r4", "r2", "r1"]
    probe, calls = prober(step(8))
    assert find_changes(R, probe).changes == [("r7", "r8")] and calls == ["r0", "r8", "r4", "r6", "r7"]


def test_two_releases_and_one_release():
    probe, calls = prober({"r0": 1, "r1": 2})
    assert find_changes(["r0", "r1"], probe).changes == [("r0", "r1")] and calls == ["r0", "r1"]
    probe, calls = prober({"r0": 1})
    one = find_changes(["r0"], probe)
    assert one.changes == [] and calls == ["r0"] and one.runs == 1
    assert find_changes([], prober({})[0]).changes == []


def test_changes_are_listed_in_release_order_and_values_compare_as_json():
    values = {r: {"x": 1, "y": 2} if i < 2 else {"y": 2, "x": 1} if i < 7 else [1] for i, r in enumerate(R)}
    search = find_changes(R, prober(values)[0])
    assert search.changes == [("r6", "r7")]  # key order is not a change
    twice = {r: 0 if i < 2 else 1 if i < 6 else 2 for i, r in enumerate(R)}
    search = find_changes(R, prober(twice)[0])
    assert search.changes == [("r1", "r2"), ("r5", "r6")]
    assert same(None, None) and not same(0, None) and not same("1", 1) and same({"a": [1]}, {"a": [1]})


def test_skips_at_both_ends_move_inward_and_are_recorded():
    probe, calls = prober(step(5), broken={"r0": "old python", "r8": "needs kernels", "r7": "needs kernels"})
    search = find_changes(R, probe)
    assert search.changes == [("r4", "r5")]
    assert calls[:4] == ["r0", "r1", "r8", "r7"] and calls[4] == "r6"
    assert search.skipped == {"r0": "not installable: old python", "r8": "not installable: needs kernels",
                              "r7": "not installable: needs kernels"}
    assert [p.release for p in search.tried()] == sorted(set(calls), key=R.index)


def test_a_skipped_middle_is_replaced_by_its_neighbours_and_never_guessed():
    probe, calls = prober(step(5), broken={"r4": "x", "r5": "y"})
    search = find_changes(R, probe)
    assert search.changes == [("r3", "r6")]
    assert "r4" in calls and "r5" in calls and len(calls) == len(set(calls))


def test_runs_count_failed_notebooks_but_not_failed_installs():
    probe, _ = prober(step(5), broken={"r4": "x"}, failed={"r6": "kernel died"})
    search = find_changes(R, probe)
    assert search.runs == sum(1 for p in search.probes.values() if p.ok) + 1
    assert search.skipped["r6"] == "notebook failed: kernel died" and search.skipped["r4"] == "not installable: x"


def test_no_usable_end_means_no_search():
    probe, calls = prober({}, broken={r: "x" for r in R})
    search = find_changes(R, probe)
    assert search.changes == [] and calls == R and search.runs == 0
    probe, calls = prober({"r0": 1}, broken={r: "x" for r in R[1:]})
    only = find_changes(R, probe)
    assert only.changes == [] and calls == ["r0", *R[:0:-1]] and only.runs == 1


def test_an_interrupt_at_the_second_end_keeps_the_first():
    def probe(release: str) -> Probe:
        if release == "r8":
            raise Interrupted()
        return Probe(release, 1)
    search = find_changes(R, probe)
    assert search.interrupted and list(search.probes) == ["r0"] and search.changes == []
    assert not Search(["a"]).interrupted and Search(["a"]).tried() == []


def test_changes_keep_release_order_not_name_order_and_values_need_not_be_json():
    from pathlib import Path

    names = ["5.8.0", "5.9.0", "5.10.0", "5.11.0", "5.12.0"]
    values = {"5.8.0": 0, "5.9.0": 1, "5.10.0": 1, "5.11.0": 2, "5.12.0": 2}
    assert find_changes(names, prober(values)[0]).changes == [("5.8.0", "5.9.0"), ("5.10.0", "5.11.0")]
    assert same(Path("a"), Path("a")) and not same(Path("a"), Path("b")) and same({1, 2}, {1, 2})
