"""04's separate claims for the source's "top-1 token: changed" and "cosine similarity: 0.8698": each fed a
measurement that contradicts it."""
from __future__ import annotations

from helpers.boundary import decisions as boundary_decisions


def row(cache="original", call="generate", args="full mask (L+1)", diff=0.19, cosine=0.977, top1_equal=True,
        result="worked") -> dict:
    return {"cache": cache, "call": call, "args": args, "result": result, "max_abs_diff": diff, "cosine": cosine,
            "top1": 7.0, "top1_reference": 7.0 if top1_equal else 3.0, "top1_equal": top1_equal, "top5_overlap": 4,
            "top1_margin_reference": 0.11}


def test_top1_changed_is_decided_on_the_plain_refeed():
    assert boundary_decisions.decide_top1_changed([row(top1_equal=False)]).holds
    d = boundary_decisions.decide_top1_changed([row(top1_equal=True), row(args="full mask (L+1) + positions (L-1)", top1_equal=False)])
    assert not d.holds and "top-1 unchanged (token 7)" in d.why and "0.11" in d.why
    assert d.deciding == {"top1_changed": False, "top1_margin": 0.11} and d.source == {"top1_changed": True}
    none = boundary_decisions.decide_top1_changed([row(result="failed", diff=None)])
    assert not none.holds and none.deciding["top1_changed"] is None and "no plain re-feed" in none.why


def test_cosine_is_like_the_sources_within_a_factor_of_two():
    assert boundary_decisions.decide_cosine_like_source([row(cosine=0.8698)]).holds
    assert boundary_decisions.decide_cosine_like_source([row(cosine=0.93)]).holds  # 1 - cos 0.07 >= 0.0651
    low = boundary_decisions.decide_cosine_like_source([row(cosine=0.977)])
    assert not low.holds and "move less" in low.why and low.source == {"cosine": 0.8698}
    high = boundary_decisions.decide_cosine_like_source([row(cosine=0.5)])
    assert not high.holds and "move more" in high.why
    assert not boundary_decisions.decide_cosine_like_source([]).holds
