"""No function in `src/corral` is longer than LIMIT lines, except the ones below, each
with the reason it still is (issue 24: a function that long does more than one thing).
A new long function fails here; an exception that got short must leave the list."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "corral"
LIMIT = 60

#: (path under src/corral, qualified name) -> why it is longer than LIMIT
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("adapters/agentcompass/environment.py", "define"): (
        "builds AgentCompass's classes on the contract it is given, so the unit tests on "
        "Python 3.11 (no AgentCompass) build them on a stand-in"
    ),
    ("network/iptables.py", "_render_family"): (
        "the order of one family's rules is the security argument; it reads top to bottom"
    ),
    ("testing/escapes.py", "catalogue"): "a table of techniques, one entry per line",
    ("demo.py", "run_demo"): "the demo's script, step by step as it prints them",
}


def _functions(tree: ast.Module) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function, methods as Class.name."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                found.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _long() -> dict[tuple[str, str], int]:
    long: dict[tuple[str, str], int] = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        for name, lines in _functions(ast.parse(path.read_text())):
            if lines > LIMIT:
                long[relative, name] = lines
    return long


def test_no_function_is_longer_than_the_limit_but_the_listed_ones() -> None:
    unlisted = {key: lines for key, lines in _long().items() if key not in EXCEPTIONS}
    assert unlisted == {}, f"functions over {LIMIT} lines: split them, or list them with why"


def test_every_listed_exception_is_still_long() -> None:
    long = _long()
    stale = sorted(key for key in EXCEPTIONS if key not in long)
    assert stale == [], f"now at most {LIMIT} lines: take them off EXCEPTIONS"


def test_the_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    assert _functions(ast.parse(f"class C:\n  def f(self):\n{body}\n")) == [("C.f", LIMIT + 2)]
