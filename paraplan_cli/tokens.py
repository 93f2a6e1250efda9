"""``paraplan token create | list | revoke``: the API's tokens, and what the first one changes.

The API is open while no token exists (``PARAPLAN_OPEN_WHEN_NO_TOKENS``); the first token closes it, which
without a word left a newcomer's curl and form with a bare 401. ``create`` says so on stderr (stdout holds the
token alone, for scripts)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from service.db.engine import Database
    from service.settings import Settings

app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)


def _fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


@contextmanager
def connected(settings: Settings) -> Iterator[Database]:
    """The configured database; an error naming it (and `paraplan db upgrade`) when it does not exist or is not
    migrated, never an empty SQLite file created on the way."""
    from sqlalchemy.exc import SQLAlchemyError

    from service.db.engine import Database, DatabaseMissing, require_database, shown_url

    try:
        require_database(settings.database_url)
    except DatabaseMissing as err:
        _fail(str(err), 1)
    db = Database.connect(settings.database_url, pool_size=1)
    try:
        yield db
    except SQLAlchemyError as err:
        _fail(f"database {shown_url(settings.database_url)}: {type(err).__name__}; is it migrated? "
              "`paraplan db upgrade` migrates this one", 1)
    finally:
        db.dispose()


def first_token_note(settings: Settings, scope: str) -> str:
    """What creating the first token changes, and how each client sends one from now on."""
    reads = ("reads (GET /v1/..., the dashboard's pages) need a read token too (PARAPLAN_REQUIRE_READ_TOKEN); "
             "the dashboard asks for one at /ui/token and keeps it in a cookie"
             if settings.require_read_token else
             "reads (GET /v1/..., the dashboard's pages) stay open (PARAPLAN_REQUIRE_READ_TOKEN=true closes them)")
    lines = [
        "paraplan: this is the first API token: the API was open while none existed; from now on",
        "  - submitting plans and runs needs a submit (or admin) token: "
        "curl -H \"Authorization: Bearer $TOKEN\" ..., `paraplan plan --server URL` reads PARAPLAN_TOKEN,",
        "    and the dashboard's form takes it in its 'API token' field",
        "  - workers need a worker token: PARAPLAN_WORKER_TOKEN or --token-file FILE",
        f"  - {reads}",
        "  `paraplan token list` shows the tokens, `paraplan token revoke ID` revokes one"
        + ("; with none left the API is open again" if settings.open_when_no_tokens else ""),
    ]
    if scope not in ("submit", "admin"):
        lines.append(f"  (this token's scope is {scope}: it cannot submit; `paraplan token create --scope submit`)")
    return "\n".join(lines)


@app.command("create")
def create(
    scope: str = typer.Option(..., "--scope", help="submit | worker | read | admin"),
    name: str | None = typer.Option(None, "--name", help="a label to recognise the token by"),
) -> None:
    """Create an API token and print it (alone, on stdout). Only its hash is stored: it is shown once.

    The first token closes an open API: what changes is printed on stderr."""
    from service.settings import get_settings
    from service.tokens import active_tokens, create_token
    from solvers.errors import SpecError

    settings = get_settings()
    with connected(settings) as db:
        try:
            with db.writing() as session:
                first = active_tokens(session) == 0
                token = create_token(session, scope, settings.token_pepper, name)
        except SpecError as err:
            _fail(str(err))
    if first and settings.open_when_no_tokens:
        typer.echo(first_token_note(settings, scope), err=True)
    typer.echo(token)


@app.command("list")
def list_(all_: bool = typer.Option(False, "--all", help="include revoked tokens")) -> None:
    """The stored tokens: id, scope, name, creation time (the tokens themselves are not stored)."""
    from service.settings import get_settings
    from service.tokens import list_tokens

    settings = get_settings()
    with connected(settings) as db, db.reading() as session:
        tokens = list_tokens(session, include_revoked=all_)
    if not tokens:
        open_ = "the API is open (no token is needed)" if settings.open_when_no_tokens else \
            "the API refuses every request (PARAPLAN_OPEN_WHEN_NO_TOKENS is false)"
        typer.echo(f"no tokens: {open_}; `paraplan token create --scope submit` makes one")
        return
    typer.echo(f"{'id':<32}  {'scope':<7}  {'created (UTC)':<19}  name")
    for t in tokens:
        state = "  (revoked)" if t.revoked else ""
        typer.echo(f"{t.id:<32}  {t.scope:<7}  {t.created_at:%Y-%m-%d %H:%M:%S}  {t.name or '-'}{state}")


@app.command("revoke")
def revoke(token_id: str = typer.Argument(..., help="the token's id (`paraplan token list`)")) -> None:
    """Revoke a token (servers stop taking it within seconds)."""
    from service.settings import get_settings
    from service.tokens import active_tokens, revoke_token

    settings = get_settings()
    with connected(settings) as db, db.writing() as session:
        found = revoke_token(session, token_id)
        left = active_tokens(session)
    if not found:
        _fail(f"no token {token_id!r}; `paraplan token list` shows their ids")
    typer.echo(f"revoked {token_id}", err=True)
    if left == 0 and settings.open_when_no_tokens:
        typer.echo("paraplan: no token is left: the API is open again (anyone who reaches it may submit)", err=True)
