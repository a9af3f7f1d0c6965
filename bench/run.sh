#!/usr/bin/env bash
# Run every benchmark from a fresh clone: start the Docker Engine if none answers, build
# the test images (cached), then `python -m bench`. Extra arguments go to the runner
# (e.g. --quick, --only exec open). Results: the table on stdout, raw JSON in
# bench/results/last.json. Needs root, like the integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || python3 -m pip install --quiet uv
bash tests/integration/docker/engine.sh up
bash tests/integration/images/build.sh
exec uv run --all-extras python -m bench "$@"
