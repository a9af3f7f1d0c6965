"""Where a `local` sandbox path is on the host: always inside the session's own root.

On `local` the sandbox is the host, so a plan written for a container (`workdir
/work/project`, a binding at `/app`) would otherwise have corral write, empty and sync
the host's own directories. corral's file calls, bindings and working directories take
every sandbox path from the session's root instead; commands still see the host.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from corral.errors import ConfigError


def host_path(root: Path, workdir: Path, remote: str, *, follow: bool = True) -> Path:
    """The host path of sandbox path `remote`.

    A relative path is under `workdir`; an absolute one already inside `root` (as `pwd`,
    HOME and TMPDIR report them) is itself; any other absolute path is taken from `root`,
    so `/work/project` is `<root>/work/project`. A `..` or a symlink that would leave
    `root` is refused; with `follow=False` a symlink at `remote` itself is the path.
    """
    if not remote or "\0" in remote:
        raise ConfigError(f"sandbox path {remote!r} is not valid")
    pure = PurePosixPath(remote)
    if not pure.is_absolute():
        lexical = Path(os.path.normpath(workdir / pure))
    elif Path(os.path.normpath(pure)).is_relative_to(root):
        lexical = Path(os.path.normpath(pure))
    else:
        lexical = root / os.path.normpath(pure).lstrip("/")
    if not lexical.is_relative_to(root):
        raise ConfigError(f"sandbox path {remote!r} leaves this session's root {str(root)!r}")
    reached = lexical.resolve() if follow else lexical.parent.resolve() / lexical.name
    if not reached.is_relative_to(root):
        raise ConfigError(
            f"sandbox path {remote!r} leaves this session's root {str(root)!r} through a symlink"
        )
    return lexical
