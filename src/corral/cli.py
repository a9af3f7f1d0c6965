"""The `corral` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib.metadata import version
from typing import Annotated, Any, NoReturn

import anyio
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from corral.core.config import config_docs
from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.demo import DemoRow, run_demo
from corral.errors import CorralError, ImageRequired
from corral.network.policy import NetworkSchedule
from corral.signals import Caught, cancelled_on_signals

app = typer.Typer(help="Sandbox environments for agent harnesses.", no_args_is_help=True)
list_app = typer.Typer(help="List things corral knows about.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration reference.", no_args_is_help=True)
docs_app = typer.Typer(help="Document a config model.", no_args_is_help=True)
docker_app = typer.Typer(help="Docker provider tools.", no_args_is_help=True)
app.add_typer(list_app, name="list")
app.add_typer(docker_app, name="docker")
app.add_typer(config_app, name="config")
config_app.add_typer(docs_app, name="docs")

console = Console()
# An error is one line, however narrow the terminal: soft wrap leaves it whole.
errors = Console(stderr=True, soft_wrap=True)
EnvOption = Annotated[str, typer.Option("--env", help="provider id, see `corral list env`")]
ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="provider config field as KEY=VALUE (repeatable)"),
]


def _params(pairs: list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--param {pair!r} must be KEY=VALUE")
        params[key] = _value(value)
    return params


def _value(text: str) -> Any:
    """A list or mapping field's value as JSON (`-p 'labels={"team": "a"}'`); any other
    field's as the string the config model parses."""
    if text.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"{text!r} is not valid JSON ({exc.msg})") from None
    return text


def _refuse(exc: Exception) -> NoReturn:
    """Bad input: one line naming the value and what is wrong with it, exit 2."""
    if isinstance(exc, ValidationError):
        message = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: "
            f"{e['msg'].removeprefix('Value error, ')} (got {e['input']!r})"
            for e in exc.errors(include_url=False)
        )
    else:
        message = str(exc)
    errors.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


def _create(env_id: str, pairs: list[str] | None) -> BaseEnvironment:
    try:
        return ENVIRONMENTS.create(env_id, **_params(pairs))
    except (CorralError, ValueError) as exc:
        _refuse(exc)


def _verbosity(count: int) -> int:
    """`-v` shows corral's info events, `-vv` its debug ones; before or after a command."""
    if count:
        level = min(logging.INFO if count == 1 else logging.DEBUG, logging.getLogger().level)
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s", force=True)
    return count


def _version(shown: bool) -> None:
    if shown:
        console.print(f"corral {version('corral')}")
        raise typer.Exit()


VerboseOption = Annotated[
    int,
    typer.Option("--verbose", "-v", count=True, callback=_verbosity, help="-v info, -vv debug"),
]


@app.callback()
def main(
    verbose: VerboseOption = 0,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    if not verbose:
        # Without -v a failure is the one `error:` line the command prints; corral's events
        # (an open that failed, with its timing) are -v's, and a log error has no timestamp.
        logging.basicConfig(level=logging.ERROR, format="corral: %(message)s", force=True)


#: the width of piped output: a table keeps its natural width instead of rich's 80 columns
PIPED_WIDTH = 10_000


def _show(table: Table) -> None:
    if console.is_terminal or "COLUMNS" in os.environ:
        console.print(table)
    else:
        Console(width=PIPED_WIDTH).print(table)


@list_app.command("env")
def list_env(verbose: VerboseOption = 0) -> None:
    """Every provider: installed or why not, and what it can enforce."""
    table = Table(
        Column("id", no_wrap=True),
        "installed",
        "network modes",
        "entry types",
        "ports",
        "dynamic",
        "features",
    )
    for env_id in ENVIRONMENTS.ids():
        status = ENVIRONMENTS.status(env_id)
        if status.provider is None:
            table.add_row(env_id, escape(f"no: {status.reason}"), "", "", "", "", "")
            continue
        caps = status.provider.network_capabilities()
        features = status.provider.features().model_dump(exclude={"provider"})
        table.add_row(
            env_id,
            "yes",
            ", ".join(sorted(m.value for m in caps.modes)),
            ", ".join(sorted(t.value for t in caps.entry_types)) or "-",
            "yes" if caps.target_ports else "no",
            "yes" if caps.dynamic else "no",
            ", ".join(k.removeprefix("supports_") for k, on in features.items() if on) or "-",
        )
    _show(table)


@docs_app.command("env")
def docs_env(
    env_id: Annotated[str, typer.Argument(help="provider id")], verbose: VerboseOption = 0
) -> None:
    """Every config field of a provider: name, type with unit, default, description."""
    try:
        provider = ENVIRONMENTS.get(env_id)
    except CorralError as exc:
        _refuse(exc)
    model = provider.config_model
    console.print(f"[bold]{env_id}[/bold]: {model.__name__}. {(model.__doc__ or '').strip()}")
    # A name is what `--param` takes: never broken across lines, whatever the width.
    table = Table(Column("field", no_wrap=True), "type", "default", "description")
    for doc in config_docs(model):
        table.add_row(*(escape(part) for part in doc))
    _show(table)
    for group in model.mutually_exclusive:
        console.print(f"mutually exclusive: {', '.join(group)}")


@app.command(context_settings={"allow_extra_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="command to run, after --")],
    env_id: EnvOption = "local",
    image: Annotated[str | None, typer.Option(help="image to run")] = None,
    network: Annotated[
        str, typer.Option(help="policy: public, no-network, allowlist:a,b")
    ] = "public",
    timeout: Annotated[
        float | None, typer.Option(help="seconds before the command is killed")
    ] = None,
    param: ParamOption = None,
    verbose: VerboseOption = 0,
) -> None:
    """Run one command in a fresh sandbox; the exit code is the command's."""
    env = _create(env_id, param)
    try:
        plan = ExecutionPlan(image=image, network=NetworkSchedule.model_validate(network))
    except ValueError as exc:
        _refuse(exc)

    def relay(stream: str, text: str) -> None:
        (sys.stdout if stream == "stdout" else sys.stderr).write(text)

    async def go() -> int:
        async with cancelled_on_signals() as caught:
            async with env.session(plan) as sandbox:
                result = await sandbox.exec(command, timeout=timeout, on_output=relay)
            if result.timed_out:
                errors.print(f"corral: the command timed out after {timeout} s; it was killed")
            return 124 if result.returncode is None else result.returncode
        return _stopped(caught)

    try:
        code = anyio.run(go)
    except ImageRequired as exc:
        _refuse(CorralError(f"{exc} (here: --image IMAGE)"))
    except CorralError as exc:
        _refuse(exc)
    raise typer.Exit(code)


def _stopped(caught: Caught) -> int:
    """Ended by SIGTERM/SIGHUP, the sandbox closed: exit as the signal would have."""
    errors.print(f"corral: stopped by signal {caught.signum}; the sandbox was removed")
    return caught.exit_code or 1


def _best_env() -> str:
    status = ENVIRONMENTS.status("docker")
    if status.provider is not None and status.provider.engine_answers():
        return "docker"
    return "local"


@app.command()
def demo(
    env_id: Annotated[str | None, typer.Option("--env", help="default: docker if up")] = None,
    image: Annotated[str | None, typer.Option(help="image for container providers")] = None,
    param: ParamOption = None,
    verbose: VerboseOption = 0,
) -> None:
    """Open a sandbox, run commands, round-trip a directory, probe every network mode."""
    chosen = env_id or _best_env()
    env = _create(chosen, param)
    plan = ExecutionPlan(image=image or env.default_demo_image())
    console.print(f"corral demo on [bold]{chosen}[/bold]")
    table = Table("step", "observed", "seconds", "ok")

    def report(row: DemoRow) -> None:
        mark = "[green]yes[/green]" if row.passed else "[red]NO[/red]"
        table.add_row(row.step, row.outcome, f"{row.seconds:.2f}", mark)

    async def go() -> int:
        async with cancelled_on_signals() as caught:
            rows = await run_demo(env, plan, report)
            return 0 if all(row.passed for row in rows) else 1
        return _stopped(caught)

    code = anyio.run(go)
    _show(table)
    raise typer.Exit(code)


@app.command()
def gc(env_id: EnvOption, param: ParamOption = None, verbose: VerboseOption = 0) -> None:
    """Remove expired resources carrying corral's labels for this owner, nothing else."""
    env = _create(env_id, param)
    removed = anyio.run(env.gc)
    for item in removed:
        console.print(f"removed {item}")
    console.print(f"{len(removed)} expired resource(s) removed")


@docker_app.command("build-holder")
def build_holder(
    tag: Annotated[
        str, typer.Option(help="tag of the holder image")
    ] = "corral.local/holder:bookworm",
    base: Annotated[str, typer.Option(help="Debian bookworm base image")] = (
        "debian:bookworm-slim"
    ),
    verbose: VerboseOption = 0,
) -> None:
    """Build the network holder image from the Dockerfile shipped in the package."""
    from corral.providers.docker.holder import build_holder_image

    try:
        # A build takes minutes (it fetches packages): show that it is working.
        with errors.status(f"building {tag} from {base} (packages come from its mirror)"):
            image_id = build_holder_image(tag, base)
    except CorralError as exc:
        _refuse(exc)
    console.print(f"built {tag} ({image_id[:19]}); set holder_image={tag!r}")
