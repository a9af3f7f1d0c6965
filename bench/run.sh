#!/usr/bin/env bash
# Run every benchmark from a fresh clone: start the Docker Engine if none answers, build
# the test images (cached), then `python -m bench`. Extra arguments go to the runner
# (e.g. --quick, --only exec open). Results: the table on stdout, raw JSON in
# bench/results/last.json. Needs root, like the integration tests. It runs on Python 3.12
# where one is found (the `agentcompass` rows need it), else on the project's 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || python3 -m pip install --quiet uv
bash tests/integration/docker/engine.sh up
bash tests/integration/images/build.sh
. tests/python312.sh
if py312=$(python312); then
  UV_PROJECT_ENVIRONMENT=.venv-3.12 uv sync --python "$py312" --all-extras --frozen --quiet
  exec .venv-3.12/bin/python -m bench "$@"
fi
exec uv run --all-extras python -m bench "$@"
