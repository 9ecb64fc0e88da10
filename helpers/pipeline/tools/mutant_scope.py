"""What `make mutants` mutates: SCOPE, one Scope per module (its functions' patterns and the fast tests that run
against each mutant), the deciding modules each finding declares added to it; the tests left out of mutation runs."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

CLASS_SEP = "ǁ"  # mutmut's separator in the mangled names of methods
PACKAGE_DIR = "packages/kvresume/"  # packages/kvresume/kvresume/x.py is mutated as work/kvresume/x.py
PACKAGE_TESTS = "packages/kvresume/tests/"


@dataclass(frozen=True)
class Scope:
    """One mutated module: which of its functions ("name", "Class.method", fnmatch patterns) and the tests run."""

    module: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]

    @property
    def work_path(self) -> str:
        """The module's path in the work copy (the package's modules at its root: kvresume/x.py)."""
        return self.module.removeprefix(PACKAGE_DIR)

    @property
    def dotted(self) -> str:
        return self.work_path[:-3].replace("/", ".").removesuffix(".__init__")

    def patterns(self) -> list[str]:
        """mutmut mutant-name globs for the scoped functions."""
        mangled = [f"x{CLASS_SEP}{f.replace('.', CLASS_SEP)}" if "." in f else f"x_{f}" for f in self.functions]
        return [f"{self.dotted}.{name}__mutmut_*" for name in mangled]

    def covers(self, mutant: str) -> bool:
        return any(fnmatch.fnmatchcase(mutant, p) for p in self.patterns())


# tests/test_decisions.py pins every case's whole output (tests/golden/decision_outputs.json) of its own tables and of
# the CASES tables in tests/test_kill_*.py, so it is listed for every deciding module.
DECISION_TESTS = ("tests/test_decisions.py",)
# Tests left out of mutation runs, each with its one-line reason (pytest --deselect).
OUT_OF_MUTANTS = {
    "tests/test_api.py::test_the_upstream_file_is_standalone_and_states_the_contract":
        "it reads the guard's source text, which under mutmut is the instrumented copy (trampoline imports), not what ships",
}


def decision_scopes() -> list[Scope]:
    """The deciding modules each finding declares (helpers.findings), with their kill cases and tests."""
    from ...findings import decisions

    return [Scope(d.module, d.mutate, tuple(dict.fromkeys(DECISION_TESTS + d.tests + (d.kill,)))) for d in decisions()]


# the package's tests of resume() and its parts that run in seconds (a survivor runs them all: the other chat, image
# and row files would make each surviving mutant take ~1 min)
REUSE_TESTS = ("test_ledger_contract.py", "test_reuse_parts.py", "test_reuse_calls.py", "test_chat_resume.py")

# the package's fast tests of the ledger's operations, its fingerprints and a sliding window's rows
LEDGER_TESTS = ("test_ledger_contract.py", "test_ledger_units.py", "test_rows_units.py", "test_rows_sliding.py")
# what records the ledger: the ledger's tests, tracked resumes and rows, threads, and the recording's own parts
TRACKING_TESTS = LEDGER_TESTS + ("test_tracking_units.py", "test_reuse_calls.py", "test_chat_resume.py", "test_rows_stale.py",
                                 "test_tracking_threads.py", "test_tracking_hooks.py",
                                 "test_tracking_steps.py", "test_tracking_fast.py")

SCOPE: list[Scope] = [
    Scope("helpers/compare.py", ("NoiseFloor.*", "tensors_bitwise_equal", "ulp", "dtype_eps", "noise_floor",
                                 "max_abs_diff", "logit_metrics", "last_logits"),
          DECISION_TESTS + ("tests/test_kill_compare.py",)),
    Scope("helpers/results.py", ("verdict_for", "Results.__init__", "Results.decide", "Results.record",
                                 "Results.skip", "Results.guard"),
          ("tests/test_kinds.py", "tests/test_kill_compare.py")),
    Scope("packages/kvresume/kvresume/vision.py", ("check_new_vision_tokens", "check_uncached", "_uncached", "_explicit_3d", "_recomputed"),
          ("tests/test_newimage.py", "tests/test_kill_newimage.py")),
    Scope("packages/kvresume/kvresume/checks.py", ("*",), ("tests/test_api.py", "tests/test_kill_checks.py",
                                                            PACKAGE_TESTS + "test_contract.py")),
    Scope("packages/kvresume/kvresume/linear_checks.py", ("stale_length", "count_mismatch"),
          ("tests/test_linear_checks.py",)),
    Scope("helpers/offload/streams.py", ("join", "StreamLog.*"), ("tests/test_streams.py", "tests/test_kill_offload.py")),
    Scope("helpers/offload/calibrate.py", ("sleep_plan", "wrap_prefetches", "host_ms_to_wrap", "busy_at_wrap", "checked_rate",
                                           "clamp_cycles", "CopyTimes.table", "CopyTimes._prefetch_row", "CopyTimes.note",
                                           "CopyTimes.begin", "CopyTimes.ms", "write_order"), ("tests/test_kill_gpu.py",)),
    Scope("helpers/offload/hazards.py", ("_next_allocation", "_record_stream_called", "released_blocks", "hazard_counts",
                                        "decide_*"), ("tests/test_kill_hazards.py", "tests/test_offload_hazards.py")),
    Scope("helpers/offload/ordering.py", ("prefetch_reads", "summary_row", "_rows", "decide_*"), ("tests/test_kill_ordering.py",)),
    Scope("helpers/pipeline/bisect/search.py", ("same", "_value", "_end", "_halve", "find_changes", "Search.*"),
          ("tests/test_kill_bisect.py", "tests/test_bisect.py")),
    Scope("helpers/pipeline/report/claims_md.py", ("kind_counts", "reproduced_count", "headline", "counts_table", "undecided"),
          ("tests/test_summary.py", "tests/test_kill_summary.py")),
    Scope("helpers/pipeline/report/summary.py", ("missing_notebooks",), ("tests/test_summary.py", "tests/test_kill_summary.py")),
    Scope("packages/kvresume/kvresume/ledger_checks.py", ("*",), ("tests/test_ledger.py", "tests/test_kill_ledger_checks.py",
                                                                    "tests/test_kill_ledger_refuse.py",
                                                                    PACKAGE_TESTS + "test_ledger_contract.py",
                                                                    PACKAGE_TESTS + "test_ledger_checks_units.py")),
    # the rest of the package: the ledger, its recording, resume() and the factory, with their package tests
    Scope("packages/kvresume/kvresume/ledger.py", ("*", "Ledger.*"), ("tests/test_ledger.py", "tests/test_kill_ledger.py",
                                                             *(PACKAGE_TESTS + f for f in LEDGER_TESTS))),
    Scope("packages/kvresume/kvresume/tracking.py", ("*", "Tracker.*"), ("tests/test_ledger.py", "tests/test_kill_ledger.py",
                                                               *(PACKAGE_TESTS + f for f in TRACKING_TESTS))),
    # where a tracked write starts (the tracking pre-hook's part): the same tests
    Scope("packages/kvresume/kvresume/steps.py", ("*",), ("tests/test_ledger.py", "tests/test_kill_ledger.py",
                                                          *(PACKAGE_TESTS + f for f in TRACKING_TESTS))),
    Scope("packages/kvresume/kvresume/reuse.py", ("*",), ("tests/test_ledger.py", "tests/test_linear_checks.py",
                                                            *(PACKAGE_TESTS + f for f in REUSE_TESTS))),
    Scope("packages/kvresume/kvresume/factory.py", ("*",), ("tests/test_api.py", "tests/test_kill_api.py",
                                                             PACKAGE_TESTS + "test_factory.py")),
    # which generate() settings resume() must re-prefill or count over the whole sequence
    Scope("packages/kvresume/kvresume/whole.py", ("*", "_Whole.*", "_WholeProcessor.*"),
          tuple(PACKAGE_TESTS + f for f in ("test_whole.py", "test_whole_units.py", "test_server_caches.py"))),
    # which calls the prefix pool cannot resume, what tells two models' caches apart, which cache a call resumes,
    # what the pool keeps under its budgets, and which failed resumes it re-prefills
    Scope("packages/kvresume/kvresume/pool.py", ("unpooled", "identity", "_bytes", "_length", "Pool.over", "Pool.generate",
                                                 "Pool._plain", "Pool._pooled", "Pool._best", "Pool._keep"),
          tuple(PACKAGE_TESTS + f for f in ("test_pool_rules.py", "test_pool_fast.py", "test_server_caches.py"))),
    # which rows the cache holds against the ids' (selected, or repeated as generate() expands the ids), a stale ledger
    Scope("packages/kvresume/kvresume/row_checks.py", ("*",), tuple(PACKAGE_TESTS + f for f in ("test_rows_rules.py", "test_rows_units.py", "test_rows_expanded.py", "test_rows.py",
                                                                                 "test_rows_stale.py"))),
    # the rest of the package, module by module, each with the fast tests that call it
    # what the guard reads from generate()'s arguments and its first model call
    Scope("packages/kvresume/kvresume/call.py", ("*", "ResumeCall.*"),
          ("tests/test_kill_checks.py", *(PACKAGE_TESTS + f for f in ("test_contract.py", "test_ledger_checks_units.py",
                                                                      "test_rows_rules.py", "test_tracking_units.py",
                                                                      "test_call_units.py")))),
    # what differs between releases (cache and keyword names, the text config, the rope state, the linear count)
    Scope("packages/kvresume/kvresume/compat.py", ("*",),
          tuple(PACKAGE_TESTS + f for f in ("test_compat_units.py", "test_factory.py", "test_contract.py"))),
    # which slot a fingerprint reads and which rows match
    Scope("packages/kvresume/kvresume/fingerprint.py", ("*",),
          tuple(PACKAGE_TESTS + f for f in ("test_rows_units.py", "test_rows_sliding.py", "test_tracking_hooks.py",
                                            "test_tracking_steps.py", "test_ledger_units.py", "test_fingerprint_units.py"))),
    # the guard: which checks run where, and the dry run that stops before any layer writes
    Scope("packages/kvresume/kvresume/guard.py", ("*",),
          ("tests/test_api.py", "tests/test_kill_api.py",
           *(PACKAGE_TESTS + f for f in ("test_contract.py", "test_ledger_contract.py", "test_chat_dryrun.py",
                                         "test_guard_units.py")))),
    # image slots keyed by their pixels: the spans, the reusable cut, the fed slices
    Scope("packages/kvresume/kvresume/images.py", ("*", "_Encoder.*"),
          tuple(PACKAGE_TESTS + f for f in ("test_images.py", "test_tracking_hooks.py", "test_images_units.py"))),
    # which layers hold K/V or linear state, their lengths, their bitwise equality
    Scope("packages/kvresume/kvresume/layers.py", ("*",),
          ("tests/test_api.py", "tests/test_regress.py",
           *(PACKAGE_TESTS + f for f in ("test_chat_dryrun.py", "test_layers_units.py")))),
    # what a pickled tracked model holds
    Scope("packages/kvresume/kvresume/pickling.py", ("*", "Hook.*"),
          tuple(PACKAGE_TESTS + f for f in ("test_tracking_pickle.py", "test_pickling_units.py"))),
    # what of a cache resume() reuses and why the common prefix broke
    Scope("packages/kvresume/kvresume/prefix.py", ("*",),
          tuple(PACKAGE_TESTS + f for f in ("test_reuse_parts.py", "test_reuse_calls.py", "test_chat_prefix.py",
                                            "test_chat_template.py", "test_prefix_units.py"))),
    # the resume-state object: its checks, validation against a model, save and load
    Scope("packages/kvresume/kvresume/state.py", ("*", "ResumeState.*"),
          ("tests/test_resume.py", "tests/test_rope_boundary.py", PACKAGE_TESTS + "test_state_units.py")),
    # one tracked write, decode steps and the unfolded tail
    Scope("packages/kvresume/kvresume/writes.py", ("*", "Write.*", "Steps.*", "Tail.*"),
          tuple(PACKAGE_TESTS + f for f in ("test_writes_units.py", "test_rows_units.py", "test_tracking_fast.py",
                                            "test_tracking_hooks.py", "test_tracking_steps.py", "test_tracking_units.py"))),
    # the serving folders: the tiny model folders the serve tests load; left out: free_port, launch, ready, start
    # (they start server processes and wait on sockets, run only by the e2e serve tests)
    Scope("packages/kvresume/kvresume/serving/folders.py", ("corpus", "tokenizer", "config", "parameters", "chat_folder",
                                                            "vlm_folder"), (PACKAGE_TESTS + "test_folders_units.py",)),
    # kvresume serve: its argument parsing, what the pool is given, the per-request tag and the cached tokens
    # reported; left out: install (it patches transformers' server classes, exercised only inside a server process by
    # the e2e serve tests), _logger and PooledLoader (5.25's model process)
    Scope("packages/kvresume/kvresume/serving/serve.py", ("main", "pooled", "_local", "record_for", "_with_cached",
                                                          "_tagged"), (PACKAGE_TESTS + "test_serve_units.py",)),
]
SCOPE += decision_scopes()  # the deciding modules: each finding declares its own
