"""Write a single-layer image as a docker-archive tarball (what ``docker save`` writes).

``ctr -n k8s.io images import`` reads it.  Used by build.sh to make the local cluster's
pause image and test image from files on this machine, with no registry::

    python3 make_image.py --name corral.local/test:busybox --rootfs DIR --cmd /bin/sh --out t.tar
    python3 make_image.py --name corral.local/pause:1 --file ./pause:/pause:755 \
        --entrypoint /pause --out pause.tar
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def build_layer(rootfs: Path | None, files: list[str]) -> bytes:
    """Return an uncompressed layer tar of ``rootfs`` plus the ``SRC:DST:MODE`` files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if rootfs is not None:
            for dirpath, dirnames, filenames in os.walk(rootfs):
                dirnames.sort()
                rel_dir = Path(dirpath).relative_to(rootfs)
                for name in sorted(dirnames) + sorted(filenames):
                    full = Path(dirpath) / name
                    arcname = str(rel_dir / name) if str(rel_dir) != "." else name
                    info = _normalize(tar.gettarinfo(str(full), arcname))
                    if info.isfile():
                        with full.open("rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
        for spec in files:
            src, dst, mode = spec.split(":")
            data = Path(src).read_bytes()
            info = _normalize(tarfile.TarInfo(dst.lstrip("/")))
            info.size = len(data)
            info.mode = int(mode, 8)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_archive(
    out: Path, name: str, layer: bytes, entrypoint: list[str], cmd: list[str]
) -> None:
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": [PATH_ENV],
            "Entrypoint": entrypoint or None,
            "Cmd": cmd or None,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "corral make_image.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = f"{layer_digest}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    repositories = {name.rsplit(":", 1)[0]: {name.rsplit(":", 1)[1]: layer_digest}}
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in (
            (config_name, config_bytes),
            (layer_name, layer),
            ("manifest.json", json.dumps(manifest).encode()),
            ("repositories", json.dumps(repositories).encode()),
        ):
            info = _normalize(tarfile.TarInfo(arcname))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True, help="image reference, e.g. corral.local/x:1")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rootfs", type=Path, help="directory to use as the root filesystem")
    parser.add_argument("--file", action="append", default=[], help="SRC:DST:MODE (octal)")
    parser.add_argument("--entrypoint", action="append", default=[])
    parser.add_argument("--cmd", action="append", default=[])
    args = parser.parse_args()
    layer = build_layer(args.rootfs, args.file)
    write_archive(args.out, args.name, layer, args.entrypoint, args.cmd)


if __name__ == "__main__":
    main()
