"""``paraplan worker`` (the daemon) and ``paraplan worker profile`` (measure this node, upload a profile).

Heavy imports (torch, httpx) happen inside the commands, so ``paraplan --help`` stays fast and works
without the worker extras installed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import NoReturn

import typer

app = typer.Typer(help="GPU worker: run plans (default) or profile this node.", add_completion=False)


def _fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


TOKEN_HELP = "worker token; PARAPLAN_WORKER_TOKEN or --token-file keep it out of `ps`"
TOKEN_FILE_HELP = "a file holding the worker token (its first line)"
TOKEN_SOURCES = "PARAPLAN_WORKER_TOKEN, --token-file (or PARAPLAN_WORKER_TOKEN_FILE) or --token"


def _token(token: str | None, token_file: Path | None) -> str | None:
    """The token given, else the first line of the token file (a command line is visible to every user in `ps`)."""
    if token or token_file is None:
        return token
    try:
        lines = token_file.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        _fail(f"--token-file: cannot read {token_file}: {getattr(err, 'strerror', None) or err}")
    value = lines[0].strip() if lines else ""
    if not value:
        _fail(f"--token-file: {token_file} is empty")
    return value


@app.callback(invoke_without_command=True)
def worker(
    ctx: typer.Context,
    server: str | None = typer.Option(None, "--server", envvar="PARAPLAN_SERVER_URL", help="paraplan server URL"),
    token: str | None = typer.Option(None, "--token", envvar="PARAPLAN_WORKER_TOKEN", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", envvar="PARAPLAN_WORKER_TOKEN_FILE",
                                           help=TOKEN_FILE_HELP),
    gpus: int | None = typer.Option(None, "--gpus", min=1,
                                    help="ranks this host offers a run (default: its GPUs; on CPU max(4, cores))"),
) -> None:
    """Run the worker daemon: pull runs, execute them with torch.distributed, report metrics."""
    if ctx.invoked_subcommand is not None:
        return
    token = _token(token, token_file)
    if not server or not token:
        _fail(f"--server (or PARAPLAN_SERVER_URL) and a token ({TOKEN_SOURCES}) are required to run the daemon")
    try:
        from worker.daemon import main as worker_main
    except ModuleNotFoundError as err:
        _fail(f"the worker is not installed here ({err.name}); pip install 'paraplan[worker]'")
    worker_main(server=str(server), token=str(token), **({"gpus": gpus} if gpus else {}))


@app.command()
def profile(
    model: str = typer.Option("llama2-7b", "--model", help="model preset name, or a ModelSpec JSON object"),
    nproc: int = typer.Option(0, "--nproc", help="processes (default: GPUs on this node, or 4 on CPU)"),
    seqs: str = typer.Option("2048", "--seqs", help="sequence lengths, comma-separated"),
    batches: str = typer.Option("1,2,4", "--batches", help="per-rank batch sizes, comma-separated"),
    repeats: int = typer.Option(5, "--repeats", min=1),
    out: Path | None = typer.Option(None, "--out", help="write the profile document here"),
    server: str | None = typer.Option(None, "--server", help="upload the profile to this server"),
    token: str | None = typer.Option(None, "--token", envvar="PARAPLAN_WORKER_TOKEN", help=TOKEN_HELP),
    token_file: Path | None = typer.Option(None, "--token-file", envvar="PARAPLAN_WORKER_TOKEN_FILE",
                                           help=TOKEN_FILE_HELP),
    name: str = typer.Option("", "--name", help="profile name (default: device, ranks and date)"),
    nnodes: int = typer.Option(1, "--nnodes", help="nodes profiled together (each runs this command with its "
                                                   "--node-rank): collectives across them are measured too"),
    node_rank: int = typer.Option(0, "--node-rank", help="this node's index, 0 to --nnodes - 1"),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint",
                                             help="host:port of node 0, where the nodes meet (with --nnodes > 1)"),
    rdzv_id: str = typer.Option("paraplan-profile", "--rdzv-id", help="the same on every node of one profile"),
    network_gbps: float | None = typer.Option(
        None, "--inter-node-bandwidth-Gbps", help="the nodes' network, per node, all NICs together (with --nnodes > "
        "1): recorded in the profile, so that a calibration set fitted on it measures the network's efficiency "
        "against this, not against the GPU preset's"),
) -> None:
    """Measure layer times and collective bandwidth on this node (or on --nnodes nodes together); print, save and/or
    upload the profile. On several nodes the one holding rank 0 writes and uploads it; the others only measure."""
    from solvers.cost_model.profile import load_profile
    from solvers.errors import SpecError
    from solvers.specs import MAX_BANDWIDTH, MIN_BANDWIDTH, ModelSpec
    from worker.launch import Launch, torchrun_command

    raw = json.loads(model) if model.strip().startswith("{") else {"preset": model}
    try:
        ModelSpec.model_validate(raw)
    except ValueError as err:
        _fail(f"--model: {err}")
    if nnodes < 1:
        _fail(f"--nnodes: must be at least 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        _fail(f"--node-rank: must be 0 to {nnodes - 1} for --nnodes {nnodes}, got {node_rank}")
    if nnodes > 1 and not rdzv_endpoint:
        _fail("--rdzv-endpoint: node 0's host:port is required to profile several nodes together")
    if network_gbps is not None and not MIN_BANDWIDTH <= network_gbps <= MAX_BANDWIDTH:
        _fail(f"--inter-node-bandwidth-Gbps: must be a positive number of Gb/s per node, got {network_gbps}")
    import torch

    n = nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 4)
    # written by rank 0 into this node's own directory, so that on a shared filesystem (the same --out on every node)
    # only the node holding rank 0 finds it, saves it to --out and uploads it
    written = Path(tempfile.mkdtemp(prefix="paraplan-profile-")) / "profile.json"
    launch = Launch(n, nnodes=nnodes, node_rank=node_rank, rendezvous_endpoint=rdzv_endpoint, rendezvous_id=rdzv_id)
    cmd = [*torchrun_command(launch), "-m", "worker.profiler", "--model", json.dumps(raw), "--seqs", seqs,
           "--batches", batches, "--repeats", str(repeats), "--name", name, "--out", str(written),
           *(["--inter-node-bandwidth-Gbps", str(network_gbps)] if network_gbps is not None else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        _fail(f"profiling failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", code=1)
    if not written.exists():
        if nnodes > 1:  # rank 0 ran on another node, which writes and uploads the profile
            typer.echo(f"node {node_rank} of {nnodes}: measured; the node holding rank 0 writes the profile",
                       err=True)
            return
        _fail(f"profiling wrote no profile:\n{proc.stderr[-3000:]}", code=1)
    text = written.read_text()
    doc = json.loads(text)
    target = out or written
    if out is not None:
        try:
            out.write_text(text)
        except OSError as err:
            _fail(f"--out: cannot write {out}: {err.strerror or err}", code=1)
    try:
        load_profile(doc["profile"])  # the shape the cost model reads
    except SpecError as err:
        _fail(f"profile does not validate: {err}", code=1)
    p = doc["profile"]
    typer.echo(f"{p['name']}: {len(p['layer_times'])} layer points, {len(p['collectives'])} collective points "
               f"-> {target}", err=True)
    if nnodes > 1 and network_gbps is None:
        typer.echo("the profile states no network bandwidth (--inter-node-bandwidth-Gbps): a calibration set fitted "
                   "on it measures the network's efficiency against its GPU preset's", err=True)
    if server:
        token = _token(token, token_file)
        if not token:
            _fail(f"a token ({TOKEN_SOURCES}) is required to upload")
        from worker.api import WorkerApi, WorkerApiError

        api = WorkerApi(server, str(token), max_retry_s=60)
        try:
            created = api.upload_profile(p["name"], "hardware", socket.gethostname(), p)
        except WorkerApiError as err:
            _fail(f"upload failed: {err}", code=1)
        finally:
            api.close()
        typer.echo(json.dumps({"id": created.get("id"), "name": p["name"]}))
    else:
        typer.echo(json.dumps(doc))
