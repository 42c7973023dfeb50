"""``tether rollouts show`` says how the trainer cuts a rollout into samples: one, or
segments where the token prefix broke (a context reset, a sub-agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.cli._views import print_rollout, segments_line
from tether.records import Call, CallStatus, Rollout
from tether.store import Store


def _call(seq: int, prompt: list[int], completion: list[int], **kw: object) -> Call:
    return Call("r", seq, prompt, completion, [-0.5] * len(completion), 0, **kw)  # type: ignore[arg-type]


def test_segments_line_names_the_calls_of_each_sample() -> None:
    c0 = _call(0, [1, 2], [3])
    c1 = _call(1, [1, 2, 3, 4], [5])  # extends call 0
    sub = _call(2, [9, 9], [6])  # a sub-agent's own prompt
    c3 = _call(3, [1, 2, 3, 4, 5, 7], [8])  # the main conversation goes on
    assert segments_line([c0, c1]) == "samples: 1 (calls 0, 1 merged)"
    assert segments_line([c0]) == "samples: 1 (call 0 alone)"
    assert segments_line([c0, c1, sub, c3]) == (
        "samples: 2 (segments: calls 0, 1, 3 | 2; a call whose prompt does not extend an "
        "earlier call's tokens starts a new one)"
    )
    failed = _call(1, [1, 2, 3], [], status=CallStatus.FAILED)
    assert segments_line([c0, failed]) == "samples: 1 (call 0 alone; 1 failed call not trained)"
    assert segments_line([failed]) == "samples: 0 (no successful call; 1 failed call not trained)"


def test_rollouts_show_prints_the_segments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with Store(tmp_path / "t.db") as db:
        db.create_rollout(Rollout(id="r", task={"q": 1}))
        attempt = db.start_attempt("r")
        for c in (_call(0, [1, 2], [3]), _call(1, [7], [4, 5])):  # a context reset at call 1
            c.attempt = attempt
            db.record_call(c)
        print_rollout(db, "r", tokens=False)
    assert "samples: 2 (segments: calls 0 | 1; a call whose prompt" in capsys.readouterr().out
