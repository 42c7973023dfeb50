"""``tether rollouts list`` and ``tether rollouts show`` (the tables: ``_views.py``; which
store: ``_stores.py``)."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli._app import RunArg, StoreOpt, rollouts_app


@rollouts_app.command("list")
def rollouts_list(
    run: RunArg = None,
    store: StoreOpt = None,
    run_id: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status.")] = None,
    limit: Annotated[int, typer.Option(help="Most rows to show.")] = 50,
) -> None:
    """List stored rollouts, newest last.

    Reads tether serve's store (.tether/traces.sqlite), or a run's with RUN.
    """
    from tether.cli._stores import open_store
    from tether.cli._views import print_rollouts

    print_rollouts(open_store(store, run), run=run_id, status=status, limit=limit)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id.")],
    run: RunArg = None,
    store: StoreOpt = None,
    tokens: Annotated[
        bool, typer.Option(help="Show each completion token with its id and logprob.")
    ] = True,
) -> None:
    """Show one rollout: its calls, messages, tokens and logprobs."""
    from tether.cli._stores import store_for_rollout
    from tether.cli._views import print_rollout

    print_rollout(store_for_rollout(rollout_id, store, run), rollout_id, tokens=tokens)
