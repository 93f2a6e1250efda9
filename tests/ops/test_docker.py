"""The container files agree with the code: we cannot run a Docker engine here, so check them statically.

Every build context and Dockerfile exists, every ``PARAPLAN_*`` variable set in the compose file is one
the code reads (service settings or a CLI option's envvar), every ``paraplan`` command the images run
exists in the CLI, and published ports match the port the service is told to bind.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import typer
import yaml

from paraplan_cli.main import app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _cli_commands() -> tuple[set[tuple[str, ...]], set[str]]:
    """All command paths of the CLI, and every envvar its options read."""
    root = typer.main.get_command(app)
    paths: set[tuple[str, ...]] = set()
    envvars: set[str] = set()

    def walk(cmd: Any, prefix: tuple[str, ...]) -> None:
        paths.add(prefix)
        for p in cmd.params:
            ev = getattr(p, "envvar", None)
            envvars.update([ev] if isinstance(ev, str) else list(ev or []))
        # typer vendors its own click: duck-type groups by their `commands` mapping.
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*prefix, name))

    walk(root, ())
    return paths, envvars


CLI_PATHS, CLI_ENVVARS = _cli_commands()
SETTINGS_ENV = {f"PARAPLAN_{name.upper()}" for name in Settings.model_fields}


def _paraplan_invocations(command: str) -> list[tuple[str, ...]]:
    """The subcommand path of every `paraplan ...` call in a shell command line."""
    out = []
    for part in re.split(r"&&|\|\||;", command):
        words = shlex.split(part)
        if words and words[0] == "paraplan":
            out.append(tuple(w for w in words[1:] if not w.startswith("-") and not w.startswith("$")))
    return out


def _assert_cli_has(invocation: tuple[str, ...], where: str) -> None:
    # The longest prefix of the words that is a command path must be a leaf or accept the rest as arguments.
    assert any(invocation[:n] in CLI_PATHS and n > 0 for n in range(len(invocation), 0, -1)), (
        f"{where}: `paraplan {' '.join(invocation)}` is not a CLI command; known: {sorted(CLI_PATHS)}"
    )


def _command_text(cmd: Any) -> str:
    return cmd if isinstance(cmd, str) else " ".join(shlex.quote(c) for c in cmd)


def _dockerfile_cmds(path: Path) -> list[str]:
    cmds = []
    for line in path.read_text().splitlines():
        if line.startswith(("CMD", "ENTRYPOINT")):
            body = line.split(None, 1)[1]
            parts = yaml.safe_load(body) if body.startswith("[") else body
            cmds.append(parts[-1] if isinstance(parts, list) and parts[:2] == ["sh", "-c"] else _command_text(parts))
    return cmds


def test_every_service_builds_from_existing_files() -> None:
    for name, svc in COMPOSE["services"].items():
        if "build" not in svc:
            assert "image" in svc, f"{name}: neither build nor image"
            continue
        context = (DOCKER / svc["build"]["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context} is not the repository root"
        dockerfile = context / svc["build"]["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"


def test_every_paraplan_variable_is_read_by_the_code() -> None:
    known = SETTINGS_ENV | CLI_ENVVARS
    for name, svc in COMPOSE["services"].items():
        for var in svc.get("environment", {}):
            if var.startswith("PARAPLAN_"):
                assert var in known, f"{name}: {var} is read by nothing (settings: {sorted(SETTINGS_ENV)})"


def test_worker_server_and_token_reach_the_cli() -> None:
    assert "PARAPLAN_SERVER_URL" in CLI_ENVVARS, "the worker's server URL must come from the environment"
    assert "PARAPLAN_WORKER_TOKEN" in CLI_ENVVARS, "the worker token must come from the environment"


def test_every_paraplan_command_exists() -> None:
    for df in DOCKER.glob("*.Dockerfile"):
        for cmd in _dockerfile_cmds(df):
            for inv in _paraplan_invocations(cmd):
                _assert_cli_has(inv, df.name)
    for name, svc in COMPOSE["services"].items():
        if "command" in svc:
            cmd = svc["command"]
            text = cmd[-1] if isinstance(cmd, list) and cmd[:2] == ["sh", "-c"] else _command_text(cmd)
            for inv in _paraplan_invocations(text):
                _assert_cli_has(inv, f"compose service {name}")


def test_published_port_is_the_port_the_api_binds() -> None:
    api = COMPOSE["services"]["api"]
    port = str(api["environment"].get("PARAPLAN_PORT", Settings.model_fields["port"].default))
    container_ports = {p.split(":")[-1] for p in api["ports"]}
    assert port in container_ports
    assert api["environment"].get("PARAPLAN_HOST") == "0.0.0.0", "the API must bind all interfaces in a container"


def test_database_url_points_at_the_compose_postgres() -> None:
    pg = COMPOSE["services"]["postgres"]["environment"]
    for name in ("api", "dispatcher"):
        url = COMPOSE["services"][name]["environment"]["PARAPLAN_DATABASE_URL"]
        assert url.startswith("postgresql+psycopg://"), url
        assert f"{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}" in url
