"""No object of corral's has an attribute assigned from outside its own class: state is
given at construction or changed by a method of the owner (issue 24, item 5).

The check reads `src/corral`: every assignment to `x.attr` (or `x.y.attr`) where `x` is
not `self` or `cls` must be one of the writes below, each on an object of another library
whose documented API is that attribute.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "corral"

_TAR = "a tarfile.TarInfo corral builds: its fields are how an archive member is described"
_SCOPE = "an anyio CancelScope: moving its deadline is its API"
#: (path under src/corral, assignment target) -> why it is not corral's object
FOREIGN: dict[tuple[str, str], str] = {
    **{
        (path, f"info.{field}"): _TAR
        for path, fields in {
            "core/tarsafe.py": (
                "mode",
                "mtime",
                "type",
                "linkname",
                "size",
                "uid",
                "gid",
                "uname",
                "gname",
            ),
        }.items()
        for field in fields
    },
    ("providers/local/process.py", "readers.cancel_scope.deadline"): _SCOPE,
    ("testing/soak.py", "scope.deadline"): _SCOPE,
    ("core/blocking.py", "scope.deadline"): _SCOPE,
    ("core/blocking.py", "self.scope.deadline"): _SCOPE,
    ("providers/k8s/api.py", "configuration.retries"): "the kubernetes client's Configuration",
    ("providers/k8s/api.py", "configuration.connection_pool_maxsize"): (
        "the kubernetes client's Configuration"
    ),
    ("providers/k8s/api.py", "api_client.rest_client.request"): (
        "the kubernetes client's REST call, wrapped with a default timeout it lacks"
    ),
    ("providers/k8s/api.py", "self._local.core"): "a threading.local of the owner's own",
    ("testing/api_faults.py", "server.num_tickets"): "an ssl.SSLContext",
    ("testing/api_faults.py", "client.check_hostname"): "an ssl.SSLContext",
    ("testing/api_faults.py", "client.verify_mode"): "an ssl.SSLContext",
    ("adapters/inspect/results.py", "error.truncated_output"): (
        "Inspect's OutputLimitExceededError, which carries it for Inspect"
    ),
}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    for target in found:
        flat += target.elts if isinstance(target, ast.Tuple) else [target]
    return flat


def outside_writes() -> dict[tuple[str, str], int]:
    """(path, target) -> line of every attribute assignment on something but self/cls."""
    writes: dict[tuple[str, str], int] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node):
                if not isinstance(target, ast.Attribute):
                    continue
                if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
                    continue
                key = (path.relative_to(SRC).as_posix(), ast.unparse(target))
                writes.setdefault(key, getattr(node, "lineno", 0))
    return writes


def test_no_attribute_of_corrals_objects_is_assigned_from_outside_its_class() -> None:
    unexpected = sorted(
        f"{path}:{line} {target}"
        for (path, target), line in outside_writes().items()
        if (path, target) not in FOREIGN
    )
    assert not unexpected, (
        "attributes assigned from outside their class (give the value at construction, or "
        f"add a method to the owner): {unexpected}"
    )


def test_every_foreign_write_listed_still_exists() -> None:
    stale = set(FOREIGN) - set(outside_writes())
    assert not stale, f"FOREIGN lists writes that are gone: {sorted(stale)}"


def test_the_check_sees_a_write_from_outside() -> None:
    source = "def f(session):\n    session.policy = 1\n    self.ok = 2\n    a.b.c += 3\n"
    found = [ast.unparse(t) for n in ast.walk(ast.parse(source)) for t in _targets(n)]
    assert found == ["session.policy", "self.ok", "a.b.c"]
