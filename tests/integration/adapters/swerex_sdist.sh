#!/usr/bin/env bash
# SWE-ReX's own runtime tests ship in its sdist, not in its wheel. This unpacks the sdist
# of the version uv.lock pins, checked against the lock's sha256, into
# ${CORRAL_SWEREX_TESTS:-~/.cache/corral/swe-rex}/swe_rex-VERSION and prints that path;
# tests/integration/adapters/test_swerex_upstream.py runs the tests that apply from it.
# Nothing of SWE-ReX's is copied into the project. Quick when it is there already.
set -euo pipefail
cd "$(dirname "$0")/../../.."

read -r version sha < <(uv run --frozen --no-sync python - <<'PY'
import tomllib
lock = tomllib.load(open("uv.lock", "rb"))
[package] = [p for p in lock["package"] if p["name"] == "swe-rex"]
print(package["version"], package["sdist"]["hash"].removeprefix("sha256:"))
PY
)
dest=${CORRAL_SWEREX_TESTS:-$HOME/.cache/corral/swe-rex}/swe_rex-$version
if [ -f "$dest/tests/test_execution.py" ]; then
  echo "$dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
uvx --quiet pip download --quiet --no-deps --no-binary :all: "swe-rex==$version" -d "$tmp" >&2
echo "$sha  $tmp/swe_rex-$version.tar.gz" | sha256sum --check --quiet >&2
tar -xzf "$tmp/swe_rex-$version.tar.gz" -C "$tmp"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$tmp/swe_rex-$version" "$dest"
echo "$dest"
