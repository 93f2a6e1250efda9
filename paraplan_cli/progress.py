"""Local solving with a rich progress bar on stderr."""

from __future__ import annotations

from typing import Any

import typer

from solvers.api import solve
from solvers.documents import PlanResult
from solvers.errors import SpecError


def solve_with_progress(request: Any, quiet: bool = False) -> PlanResult:
    from rich.progress import Progress

    try:
        with Progress(transient=True, disable=quiet) as bar:
            task = bar.add_task("solving", total=1.0)

            def report(fraction: float, message: str) -> None:
                bar.update(task, completed=fraction, description=message)

            return solve(request, progress=report)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
