"""``paraplan`` console script: serve, plan, estimate, worker, db, token."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from paraplan_cli.tokens import app as token_app
from worker.cli import app as worker_app

if TYPE_CHECKING:  # solvers load inside the commands, so that `paraplan --help` stays fast
    from solvers.documents import Document
    from solvers.errors import SpecError

app = typer.Typer(help="paraplan: parallel training plans.", no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Database commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")


def _fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _require_database(url: str) -> None:
    """Fail naming the database (and `paraplan db upgrade`) before connecting would create an empty one."""
    from service.db.engine import DatabaseMissing, require_database

    try:
        require_database(url)
    except DatabaseMissing as err:
        _fail(str(err), 1)


def _read_json(path: Path) -> Any:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as err:
        _fail(f"cannot read {path}: {err.strerror}")
    except UnicodeDecodeError as err:  # (JSON is UTF-8; a byte 0xff crashed the CLI with a traceback)
        _fail(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); JSON is UTF-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        _fail(f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}")
    except ValueError as err:  # an integer of more digits than Python converts
        _fail(f"{path}: unreadable JSON: {err}")
    except RecursionError:
        _fail(f"{path}: unreadable JSON: nested too deeply")


def _inline_hf_config(request: Any, base: Path) -> Any:
    """A request's ``model.hf_config`` given as a path (relative to the request file) is read here, so that
    what is solved or sent to a server carries the config itself (a server never reads client paths)."""
    if isinstance(request, list):
        return [_inline_hf_config(r, base) for r in request]
    model = request.get("model") if isinstance(request, dict) else None
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        path = base / model["hf_config"]
        cfg = _read_json(path)
        if not isinstance(cfg, dict):
            _fail(f"{path}: a Hugging Face config.json holds one JSON object")
        return {**request, "model": {**model, "hf_config": cfg}}
    return request


def _read_request(path: Path) -> Any:
    base = Path.cwd() if str(path) == "-" else path.parent
    return _inline_hf_config(_read_json(path), base)


@contextlib.contextmanager
def _solver_chatter_to_stderr() -> Iterator[None]:
    """While a solver runs, file descriptor 1 is stderr's: native solver libraries write there behind Python's back
    (HiGHS prints its banner from C), and stdout is where the CLI's JSON goes (it opened with "Running HiGHS")."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # (no descriptor 1: nothing to keep clean)
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _estimate_one(request: Any) -> Document | SpecError:
    """The estimate's document, or the request's problems (an array of requests reports each in its place)."""
    from solvers.api import estimate
    from solvers.errors import SpecError

    try:
        with _solver_chatter_to_stderr():
            return estimate(request)
    except SpecError as err:
        return err


@app.command()
def plan(
    file: Path = typer.Option(..., "-f", "--file", help="request JSON (contract), or - for stdin"),
    as_json: bool = typer.Option(False, "--json", help="print the result object as JSON (default: a summary)"),
    server: str | None = typer.Option(None, "--server", help="solve on a paraplan server instead"),
    token: str | None = typer.Option(None, "--token", envvar="PARAPLAN_TOKEN"),
    export_format: str | None = typer.Option(
        None, "--export", help="print the hybrid plan as megatron arguments, a deepspeed config, a torchtitan 0.3.0 "
        "command line or a galvatron config instead of the summary"),
    export_of: str = typer.Option("plan", "--export-of", help="with --export: the plan, or a baseline (megatron: "
                                  "the best uniform plan, which Megatron-LM runs as it is)"),
) -> None:
    """Solve a plan request (hybrid / flexsp / spindle) locally or on a server."""
    request = _read_request(file)
    if export_format is not None:
        from solvers.exports import EXPORT_OF, FORMATS

        if export_format not in FORMATS:
            _fail(f"--export: unknown format {export_format!r}; known: {', '.join(FORMATS)}")
        if export_of not in EXPORT_OF:
            _fail(f"--export-of: unknown plan to export {export_of!r}; known: {', '.join(EXPORT_OF)}")
        if not isinstance(request, dict) or request.get("kind", "hybrid") != "hybrid":
            _fail("--export: only hybrid plans export to a framework")
    if server:
        from paraplan_cli.remote import plan_remote

        result = plan_remote(server, token, request, quiet=as_json)
    else:
        from paraplan_cli.progress import solve_with_progress

        with _solver_chatter_to_stderr():
            result = solve_with_progress(request, quiet=as_json)
    if export_format is not None:
        from solvers.documents import HybridResult
        from solvers.errors import SpecError
        from solvers.exports import export

        assert isinstance(result, HybridResult)  # the request was checked to be hybrid before solving
        try:
            typer.echo(export(result, export_format, request, export_of), nl=False)
        except SpecError as err:
            _fail(f"--export-of: {err.problems[0].msg}" if err.problems[0].loc == ("of",) else str(err))
        return
    if as_json or not isinstance(request, dict):
        typer.echo(json.dumps(result.to_json(), indent=None if as_json else 2))
        return
    from paraplan_cli.summary import render

    typer.echo(render(request, result))


@app.command()
def estimate(
    file: Path = typer.Option(..., "-f", "--file", help="request JSON (one object or an array)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON (default: a summary)"),
) -> None:
    """Estimate the step time and memory of a given strategy (what-if)."""
    from solvers.documents import HybridEstimateResult
    from solvers.errors import SpecError

    request = _read_request(file)
    if isinstance(request, list):
        docs = [_estimate_one(r) for r in request]
        typer.echo(json.dumps([{"error": str(d)} if isinstance(d, SpecError) else d.to_json() for d in docs]))
        return
    doc = _estimate_one(request)
    if isinstance(doc, SpecError):
        _fail(str(doc))
    if as_json or not isinstance(doc, HybridEstimateResult):
        typer.echo(json.dumps(doc.to_json(), indent=None if as_json else 2))
        return
    from paraplan_cli.summary import render_estimate

    typer.echo(render_estimate(request, doc))


@app.command()
def model(
    config: Path = typer.Argument(..., help="a Hugging Face config.json"),
) -> None:
    """Show the model spec (JSON, with its parameter count) a Hugging Face config.json imports to.

    Use it as a request's "model", or name the config there: "model": {"hf_config": "path/config.json"}."""
    from pydantic import ValidationError

    from solvers.specs import ModelSpec

    try:
        spec = ModelSpec.model_validate({"hf_config": _read_json(config)})
    except ValidationError as err:
        # each problem with its field (the spec's, e.g. num_layers, where the config gives a key it cannot map)
        _fail(f"{config}: " + "; ".join(
            (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in err.errors()))
    out = spec.model_dump(exclude_none=True)
    out["parameters"] = spec.total_params()
    typer.echo(json.dumps(out, indent=2))


@app.command()
def presets(as_json: bool = typer.Option(False, "--json", help="every preset's fields as JSON")) -> None:
    """List the model, GPU and Spindle workload presets a request may name."""
    from paraplan_cli.presets import presets as found
    from paraplan_cli.presets import render

    typer.echo(json.dumps(found(), indent=2) if as_json else render(found()))


@app.command()
def serve(
    host: str | None = typer.Option(None, help="bind address (default from settings)"),
    port: int | None = typer.Option(None, help="port (default from settings)"),
    dispatcher: bool = typer.Option(True, "--dispatcher/--no-dispatcher",
                                    help="run a solver dispatcher in this process (off for API-only replicas)"),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes"),
) -> None:
    """Run the API server (and, by default, one solver dispatcher)."""
    import os

    import uvicorn

    from service.settings import get_settings

    if not dispatcher:
        os.environ["PARAPLAN_RUN_DISPATCHER"] = "false"
        get_settings.cache_clear()
    settings = get_settings()
    _require_database(settings.database_url)
    h, p = host or settings.host, port or settings.port
    typer.echo(f"paraplan serving on http://{h}:{p}/", err=True)
    uvicorn.run("service.main:app", host=h, port=p, log_level="warning", workers=workers,
                access_log=False)


@app.command()
def solver(
    concurrency: int | None = typer.Option(None, "--concurrency", "-c", min=1,
                                           help="jobs solved at once (default from settings)"),
    max_jobs: int | None = typer.Option(None, "--max-jobs", min=1, help="exit after claiming this many jobs"),
    exit_when_idle: bool = typer.Option(False, "--exit-when-idle", help="exit when the queue is empty"),
) -> None:
    """Run a standalone solver dispatcher on the shared job queue (PARAPLAN_DATABASE_URL)."""
    import signal

    from service.db.engine import Database
    from service.dispatcher import Dispatcher
    from service.logs import configure_logging
    from service.settings import get_settings

    settings = get_settings()
    _require_database(settings.database_url)
    configure_logging(as_json=settings.log_json)
    db = Database.connect(settings.database_url, pool_size=2)
    runner = Dispatcher(db, settings)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.shutdown())
    typer.echo(f"solver dispatcher {runner.owner} started", err=True)
    runner.run(concurrency=concurrency, max_jobs=max_jobs, exit_when_idle=exit_when_idle)
    st = runner.stats
    typer.echo(json.dumps({"owner": runner.owner, "claimed": st.claimed, "succeeded": st.succeeded,
                           "failed": st.failed, "lost": st.lost}))
    db.dispose()


@app.command()
def doctor() -> None:
    """Check the database, its migrations, solver backends and torch/CUDA; print what is missing."""
    from paraplan_cli.doctor import report, run_checks

    text, code = report(run_checks())
    typer.echo(text)
    raise typer.Exit(code)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply database migrations (Alembic) to the configured database, creating it (and its data directory)."""
    from service.db.engine import shown_url
    from service.migrate import upgrade
    from service.settings import get_settings

    url = get_settings().database_url
    upgrade(revision)
    typer.echo(f"database {shown_url(url)} at {revision}", err=True)


# `paraplan worker` (daemon) and `paraplan worker profile`; worker.cli imports torch only inside commands.
app.add_typer(worker_app, name="worker")


if __name__ == "__main__":
    app()
