"""A user's rebuild triaged (notebook 06 answers it): its SOURCE and Ask writer, for the report only."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines

SOURCE = Source("triage", "Triage of a user's rebuild (the control's decision tree applied)", {},
                "a user's own compression method unless passed with `-p rebuild ...`: the kit's stand-in rebuilds take its "
                "place (no source setup to compare: the tree is the control's, the rebuilds are this kit's).")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """A user's rebuild: what to run on it (the kit's tree names a leaf only where its repair restored the result)."""
    return Lines("", "run your rebuild through the tree: `make run NB=06 ARGS=\"-p rebuild file.py:function\"`; "
                 "it names a leaf only where its repair restored the result, with the number")
