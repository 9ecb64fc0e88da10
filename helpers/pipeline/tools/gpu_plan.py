"""`make gpu-plan`: what `make gpu-check` would run, printed without CUDA (exit 0): the releases, the models and
their layouts, every arm with its lag (calibrated, or unlagged), the pinned-pool poisoning, the event probe, the
per-step timeout, and the expected device minutes (an estimate, with its assumptions)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

EDGE_RELEASE = "5.20.0"
STEP_TIMEOUT = 200.0  # seconds per step (one release's arms, or its flash step): a hang loses one step, not the run


def releases_to_run(extra: list[str] | None) -> list[str]:
    """The pinned release, 5.20.0, then `extra`, without repeats."""
    from ..matrix.envs import pinned_release

    return list(dict.fromkeys([r for r in [pinned_release(), EDGE_RELEASE, *(extra or [])] if r]))


def plan_lines(p: dict[str, Any]) -> list[str]:
    """The plan as text, one fact a line."""
    lines = [f"gpu-plan: releases {', '.join(p['releases'])} (the ordering edge from {EDGE_RELEASE}), each in its own environment"]
    for model, layout in p["layouts"].items():
        lines.append(f"  model {model}: {layout['layers']} layers, {layout['linear_attention']} linear_attention / "
                     f"{layout['full_attention']} full_attention")
    for run in p["runs"]:
        lines.append(f"  run {run['model']} {run['dtype']}: loops {', '.join(run['loops'])}")
    lags = {(a["loop"], a["arm"]): a["lag"] for a in p["arms"]}  # an arm's lag is the same on every model
    lines += [f"  arm [{loop}] {arm}: {'unlagged' if lag == 'unlagged' else 'lag calibrated'}" for (loop, arm), lag in lags.items()]
    lines += [f"  pool poisoning: {p['pool_poisoning']}", f"  event probe: {p['event_probe']}",
              f"  per-step timeout: {p['step_timeout_s']:.0f} s (each release's arms, each flash step)",
              f"  forwards per release: {p['forwards_per_release']} ({p['n_steps']} per arm)",
              f"  expected: about {p['seconds_per_release']} s per release, {p['expected_minutes']} minutes in all "
              f"(estimate: {p['assumptions']})",
              "  then the cross-release claim: drift without the ordering edge, none with it (same models, same lag)",
              "  claims:"]
    for c in p.get("claims", []):
        lines.append(f"    {c['id']}: " + (f"can fail: yes; decides {c['decides']}; fed by {c['fed_by']}" if c["can_fail"]
                                              else f"can fail: no (by construction: {c['by_construction']})"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-plan", description=__doc__)
    parser.add_argument("--releases", nargs="*", default=None, help="releases besides the pinned one and 5.20.0")
    parser.add_argument("--timeout", type=float, default=STEP_TIMEOUT, help="seconds per step (default 200)")
    args = parser.parse_args(argv)
    from ...offload.gpuplan import plan  # torch: imported only once asked

    print("\n".join(plan_lines(plan(releases_to_run(args.releases), step_timeout=args.timeout))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
