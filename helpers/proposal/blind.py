"""Where generate()'s own inputs cannot tell a silent failure from a valid call: each blind spot named, with why.

`BLIND_SPOTS` matches a cell by its group and a part of its name. A silently wrong cell the guard passes on
generate()'s own inputs counts as a named miss only where one of these says why those inputs are those of a valid
call; any other miss is unexplained and fails notebook 08's claim. With a token ledger (kvresume.ledger) the guard
refuses 03's stale rope_deltas, 07's all-ones mask and the suffix longer than the cache; these stay blind spots for
untracked caches only. 04's re-fed token under an L+1 mask, 06's prefix one short and 06's cache reused without copy.deepcopy
(mask_only: each a valid next step's inputs) stay ones with a ledger too. Whether the caller's processed length catches it
is measured per cell, not stated here.
"""
from __future__ import annotations

from .cells import Cell

BLIND_SPOTS: list[tuple[str, str, str]] = [
    ("04", "double processing", "a cache of L tokens, one token and an L+1-column mask are exactly a valid next step: "
                                "which tokens built the cache is not among generate()'s inputs; with a ledger too, a "
                                "suffix equal to the cache's last token at the next position is a repeated token "
                                "(resume on the whole ids repairs it)"),
    ("06", "streaming · mask_only", "a cache evicted to the same length in every layer, with a mask one column wider, "
                                    "is exactly an uncompressed cache of that length: how many tokens were processed "
                                    "before eviction is the caller's knowledge"),
    ("06", "crop_short · mask_only", "a cache one token short of the prompt, its last token and a mask one column "
                                     "wider are exactly a valid next step: which token the caller's sequence has before "
                                     "this one is not among generate()'s inputs; the ledger shows the cropped token, but a "
                                     "crop then another token at its position is assisted decoding's own valid step "
                                     "(resume on the whole ids repairs it)"),
    ("06", "reused_no_copy · mask_only", "a cache another request's generate() extended, one token and a mask one "
                                         "column wider are exactly that request's valid next step: which request the "
                                         "caller continues is not among generate()'s inputs, and the ledger records what "
                                         "the cache holds, not whose sequence it is (resume on the whole ids crops to the "
                                         "common prefix)"),
    ("07", "all_ones mask", "the mask is the only record of padding: an all-ones mask over a left-padded cache reads as "
                            "an unpadded batch"),
    ("03", "rope_deltas stale", "a stale rope_deltas is a tensor of the right shape like the right one: which prompt set "
                                "it is not recorded"),
    ("valid", "suffix longer than the cache", "a suffix longer than the cache with a mask of its own width looks exactly "
                                              "like a whole sequence, which generate() slices: even the processed length "
                                              "cannot tell them apart (a whole sequence's length is the processed length "
                                              "plus what is fed, too)"),
]


def reason(cell: Cell) -> str:
    """Why generate()'s inputs cannot tell this cell from a valid call ('' where no blind spot names it)."""
    for group, part, why in BLIND_SPOTS:
        if cell.group == group and part in cell.cell:
            return why
    return ""


def misses(cells: list[Cell]) -> list[dict[str, str]]:
    """Every decided miss on generate()'s own inputs: the cell, why (or ''), what the processed length did."""
    return [{"cell": f"{c.group}: {c.cell}", "why": reason(c), "with_processed_length": c.with_length or "not known"}
            for c in cells if not c.undecided and c.plain == "silently_wrong" and c.guard == "passed"]
