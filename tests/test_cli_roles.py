"""A call's role is shown wherever its calls are: ``tether rollouts show``, ``tether
export`` and the dashboard's rollout page."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dashboard_stores import KEY, get_all
from tether.cli._views import print_rollout
from tether.dashboard import Catalog, create_server_app
from tether.records import Call, Rollout
from tether.store import Store
from tether.tracking import export_attempts


def _store(path: Path) -> None:
    with Store(path) as s:
        s.create_run({}, "b-1")
        s.create_rollout(Rollout(id="b-1-s1-g0-0", run_id="b-1", group_id="b-1-s1-g0"))
        a = s.start_attempt("b-1-s1-g0-0")
        for role in ("solver", "critic", None):
            s.record_call(Call("b-1-s1-g0-0", -1, [1, 2], [3], [-0.5], 0, attempt=a, role=role))
        s.finish_rollout("b-1-s1-g0-0", "succeeded", attempt=a, reward=1.0)


def test_rollouts_show_names_each_calls_role(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _store(tmp_path / "t.db")
    with Store(tmp_path / "t.db") as s:
        print_rollout(s, "b-1-s1-g0-0", tokens=False)
    out = capsys.readouterr().out
    assert "call 0  role solver  policy v0" in out and "call 1  role critic  policy v0" in out
    assert "call 2  policy v0" in out  # no role: nothing said


def test_export_rows_carry_each_calls_role(tmp_path: Path) -> None:
    _store(tmp_path / "t.db")
    with Store(tmp_path / "t.db") as s:
        (row,) = list(export_attempts(s))
    assert [c["role"] for c in row["calls"]] == ["solver", "critic", None]


def test_the_dashboards_rollout_page_shows_each_calls_role(tmp_path: Path) -> None:
    _store(tmp_path / "b" / "traces.sqlite")
    app = create_server_app(Catalog(runs_dir=tmp_path), KEY)
    (page,) = get_all(app, ["/ui/s/b/rollout/b-1-s1-g0-0"])
    assert page.text.count('class="role"') == 2
    assert "role solver" in page.text and "role critic" in page.text
