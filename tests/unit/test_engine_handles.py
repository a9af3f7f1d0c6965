"""No function in `src/corral` takes a client and the limiter's `tokens` side by side: the
engine handle (`providers.docker.engine.Engine`) and the API clients
(`providers.k8s.api.Clients`) carry their limiter, and only their constructors take
both (issue 24, item 1)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "corral"
CLIENTS = {"client", "clients", "api", "engine", "core", "networking"}
#: (path under src/corral, function) -> the handle it constructs
CONSTRUCTORS = {
    ("providers/docker/engine.py", "__init__"): "Engine",
    ("providers/k8s/api.py", "__init__"): "Clients",
}


def _pairs(tree: ast.Module) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            names = {
                a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            }
            if "tokens" in names and names & CLIENTS:
                found.append(node.name)
    return found


def test_no_signature_takes_a_client_and_its_tokens() -> None:
    pairs = [
        (path.relative_to(SRC).as_posix(), name)
        for path in sorted(SRC.rglob("*.py"))
        for name in _pairs(ast.parse(path.read_text()))
    ]
    assert sorted(set(pairs) - set(CONSTRUCTORS)) == []
    assert set(CONSTRUCTORS) <= set(pairs), "a handle's constructor moved: update CONSTRUCTORS"


def test_the_check_sees_a_pair() -> None:
    tree = ast.parse("async def f(api, tokens, container): ...\ndef g(tokens, fn): ...")
    assert _pairs(tree) == ["f"]
