"""Read the `compose.yaml` of a simple task into an `ExecutionPlan` with services.

One service is the sandbox (the one named `main_service`, else the one marked
`x-default: true`, else the one named `default`, else the first); the others become
`ExecutionPlan.services`. Of each service only what a plan can carry is read: `image`,
`command`, `environment`, `working_dir`, `healthcheck` (services only), and `depends_on`,
which `open()` satisfies by returning only once every healthcheck passed. Anything else —
builds, ports, volumes, networks, capabilities, a `network_mode` — changes what the
sandbox is or may reach, so it is refused with an error naming the key and the service,
never silently dropped. The network policy comes from the plan's schedule, not the file.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from corral.core.plan import ExecutionPlan, Healthcheck
from corral.errors import ConfigError

SERVICE_KEYS = frozenset({"image", "command", "environment", "working_dir", "healthcheck"})
#: keys read and satisfied without a plan field: the sandbox marker, and start order
#: (`open()` returns once every service's healthcheck passed)
ACCEPTED_KEYS = frozenset({"x-default", "depends_on"})
#: top-level keys that carry nothing a plan would need
IGNORED_TOP = frozenset({"version", "name"})
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def plan_from_compose(
    source: str | Path | Mapping[str, Any],
    *,
    main_service: str | None = None,
    base: ExecutionPlan | None = None,
) -> ExecutionPlan:
    """`base` (default: an empty plan) with the image, command, env and workdir of the
    compose file's main service and its other services as `services`."""
    where = str(source) if isinstance(source, str | Path) else "compose mapping"
    document = _load(source) if isinstance(source, str | Path) else source
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where}: a compose file is a mapping with `services`")
    top: Mapping[str, Any] = document  # pyright: ignore[reportUnknownVariableType]
    extra = sorted(str(k) for k in top if k != "services" and k not in IGNORED_TOP)
    if extra:
        raise ConfigError(f"{where}: top-level {', '.join(extra)} cannot be read into a plan")
    services: Any = top.get("services")
    if not isinstance(services, Mapping) or not services:
        raise ConfigError(f"{where}: `services` must name at least one service")
    named: dict[str, Mapping[str, Any]] = {}
    for name, spec in services.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: service {name!r} must be a mapping")
        named[str(name)] = spec  # pyright: ignore[reportUnknownArgumentType]
    main = _main(named, main_service, where)
    fields = {name: _fields(name, spec, where) for name, spec in named.items()}
    main_fields = fields.pop(main)
    if main_fields.get("healthcheck") is not None:
        raise ConfigError(
            f"{where}: the main service {main!r} cannot have a healthcheck "
            "(the sandbox is ready when open() returns)"
        )
    main_fields.pop("healthcheck", None)
    plan = base or ExecutionPlan()
    update: dict[str, Any] = {"services": {**plan.services}}
    if "image" in main_fields:
        update["image"] = main_fields["image"]
    if "command" in main_fields:
        update["command"] = main_fields["command"]
    if "workdir" in main_fields:
        update["workdir"] = main_fields["workdir"]
    update["env"] = {**plan.env, **main_fields.get("env", {})}
    for name, values in fields.items():
        if "image" not in values:
            raise ConfigError(f"{where}: service {name!r} needs an `image`")
        update["services"][name] = values
    try:
        return ExecutionPlan.model_validate({**plan.model_dump(), **update})
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _load(path: str | Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def _main(named: Mapping[str, Mapping[str, Any]], chosen: str | None, where: str) -> str:
    if chosen is not None:
        if chosen not in named:
            raise ConfigError(
                f"{where}: no service {chosen!r} to be the sandbox (services: {', '.join(named)})"
            )
        return chosen
    marked = [name for name, spec in named.items() if spec.get("x-default") is True]
    if len(marked) > 1:
        raise ConfigError(f"{where}: services {', '.join(marked)} are all marked x-default")
    if marked:
        return marked[0]
    return "default" if "default" in named else next(iter(named))


def _fields(name: str, spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(str(k) for k in spec if k not in SERVICE_KEYS and k not in ACCEPTED_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: service {name!r} sets {', '.join(unknown)}, which corral cannot read "
            f"into a plan (it reads {', '.join(sorted(SERVICE_KEYS))}; the network policy "
            "comes from the plan's schedule)"
        )
    interpolated = _interpolated(spec)
    if interpolated is not None:
        # Compose would fill it from the caller's environment: never implicitly.
        raise ConfigError(
            f"{where}: service {name!r} uses interpolation ({interpolated!r}); "
            "write the value itself"
        )
    values: dict[str, Any] = {}
    if "image" in spec:
        values["image"] = spec["image"]
    if spec.get("command") is not None:
        values["command"] = _command(spec["command"], f"{where}: service {name!r} command")
    if spec.get("environment") is not None:
        values["env"] = _environment(spec["environment"], f"{where}: service {name!r}")
    if spec.get("working_dir") is not None:
        values["workdir"] = spec["working_dir"]
    if spec.get("healthcheck") is not None:
        values["healthcheck"] = _healthcheck(spec["healthcheck"], f"{where}: service {name!r}")
    return values


def _interpolated(value: Any) -> str | None:
    """The first string under `value` that compose would interpolate, or None."""
    if isinstance(value, str):
        return value if "${" in value.replace("$$", "") else None
    children: list[Any] = []
    if isinstance(value, Mapping):
        children = [*value.keys(), *value.values()]  # pyright: ignore[reportUnknownArgumentType]
    elif isinstance(value, list):
        children = value  # pyright: ignore[reportUnknownVariableType]
    for child in children:
        found = _interpolated(child)
        if found is not None:
            return found
    return None


def _command(value: Any, what: str) -> list[str]:
    # Compose splits a string command like a shell would, without running one.
    if isinstance(value, str):
        return [_literal(a) for a in shlex.split(value)]
    if isinstance(value, list) and all(isinstance(a, str | int | float) for a in value):  # pyright: ignore[reportUnknownVariableType]
        return [_literal(str(a)) for a in value]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    raise ConfigError(f"{what} {value!r} must be a string or a list of strings")


def _environment(value: Any, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    items: list[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = list(value.items())  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
    elif isinstance(value, list):
        entries: list[Any] = value  # pyright: ignore[reportUnknownVariableType]
        items = [_pair(str(entry)) for entry in entries]
    else:
        raise ConfigError(f"{what}: environment must be a mapping or a list of NAME=value")
    for key, val in items:
        if val is None:
            # Compose would take it from the caller's environment: never implicitly.
            raise ConfigError(f"{what}: environment {key!r} has no value")
        pairs[str(key)] = _literal(val) if isinstance(val, str) else _scalar(val)
    return pairs


def _pair(entry: str) -> tuple[str, str | None]:
    name, sep, value = entry.partition("=")
    return (name, value if sep else None)


def _literal(text: str) -> str:
    """Compose's `$$` is a literal `$` (interpolation itself was refused before)."""
    return text.replace("$$", "$")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _healthcheck(value: Any, what: str) -> Healthcheck | None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what}: healthcheck must be a mapping")
    check: Mapping[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
    unknown = sorted(
        str(k)
        for k in check
        if k not in {"test", "interval", "timeout", "retries", "start_period", "disable"}
    )
    if unknown:
        raise ConfigError(f"{what}: healthcheck key {', '.join(unknown)} is not supported")
    if check.get("disable") is True:
        return None
    test: Any = check.get("test")
    if isinstance(test, list) and test and test[0] == "NONE":
        return None
    if isinstance(test, list) and len(test) >= 2 and test[0] == "CMD":  # pyright: ignore[reportUnknownArgumentType]
        command: list[str] | str = [str(a) for a in test[1:]]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    elif isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":  # pyright: ignore[reportUnknownArgumentType]
        command = str(test[1])  # pyright: ignore[reportUnknownArgumentType]
    elif isinstance(test, str) and test.strip():
        command = test
    else:
        raise ConfigError(
            f"{what}: healthcheck test {test!r} must be a string, [CMD, ...] or [CMD-SHELL, cmd]"
        )
    fields: dict[str, Any] = {"test": command}
    for key, target in (("interval", "interval_s"), ("timeout", "timeout_s")):
        if key in check:
            fields[target] = _seconds(check[key], f"{what}: healthcheck {key}")
    if "start_period" in check:
        fields["start_period_s"] = _seconds(
            check["start_period"], f"{what}: healthcheck start_period"
        )
    if "retries" in check:
        fields["retries"] = check["retries"]
    try:
        return Healthcheck.model_validate(fields)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from exc


def _seconds(value: Any, what: str) -> float:
    """A compose duration (`1m30s`, `500ms`, `10s`) or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigError(f"{what} {value!r} is not a duration like 10s, 500ms or 1m30s")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)
