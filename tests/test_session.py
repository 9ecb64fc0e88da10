"""helpers.session: transformers' fallback warnings are captured into the results file, not printed in a cell."""
from __future__ import annotations

import json
import logging

from transformers.utils import logging as hf_logging

from helpers import session
from helpers.results import Results


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_fallback_warnings_go_to_the_results_not_to_stderr(tmp_path, capsys):
    res = Results("00_x", {"a": "s"}, env={}, path=tmp_path / "r.json")
    seen = _Seen()  # stands for transformers' stderr handler: what it would print in a cell
    hf_logging.get_logger().addHandler(seen)
    session.capture_warnings(res)
    try:
        log = hf_logging.get_logger("transformers.models.qwen3_next.modeling_qwen3_next")
        for _ in range(2):
            log.warning("`causal_conv1d_fn` is falling back to the torch implementation")
        log.warning("an unrelated warning")
        err = capsys.readouterr().err
        assert "falling back" not in err and seen.messages == ["an unrelated warning"]
        assert json.loads((tmp_path / "r.json").read_text())["warnings"] == [
            "`causal_conv1d_fn` is falling back to the torch implementation"]
        root = hf_logging.get_logger()
        assert session.capture_warnings(res) is session._CAPTURE and root.filters.count(session._CAPTURE) == 1
    finally:
        session.capture_warnings(None)
        hf_logging.get_logger().removeHandler(seen)

