#!/usr/bin/env bash
# Run every benchmark from a fresh clone: start the Docker Engine if none answers, build
# the test images (cached) and the exec channel's helper, bring up the test cluster unless
# one answers (the `k8s` rows; it is left running), then `python -m bench`. Extra arguments go to the runner
# (e.g. --quick, --only exec open). Results: the table on stdout, raw JSON in
# bench/results/last.json. Needs root, like the integration tests. It runs on Python 3.12
# where one is found (the `agentcompass` rows need it), else on the project's 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || python3 -m pip install --quiet uv
bash tests/integration/docker/engine.sh up
bash tests/integration/images/build.sh
export GOCACHE=${GOCACHE:-$HOME/.cache/go-build} GOMODCACHE=${GOMODCACHE:-$HOME/go/pkg/mod}
bash helper/build.sh
export KUBECONFIG=${KUBECONFIG:-/var/lib/corral-cluster/admin.kubeconfig}
# The cluster build's own kubectl (a fresh machine has no other).
kubectl=$(ls /var/cache/corral/cluster/*/bin/kubectl 2>/dev/null | head -n 1 || true)
if ! timeout 10 "${kubectl:-kubectl}" get --raw /readyz >/dev/null 2>&1; then
  bash tests/integration/cluster/up.sh
  bash tests/integration/k8s/images.sh
fi
# kwok's fake nodes for the thousands-of-sandboxes rows (built once, then cached).
bash tests/integration/cluster/build.sh kwok
. tests/python312.sh
if py312=$(python312); then
  UV_PROJECT_ENVIRONMENT=.venv-3.12 uv sync --python "$py312" --all-extras --frozen --quiet
  exec .venv-3.12/bin/python -m bench "$@"
fi
exec uv run --all-extras python -m bench "$@"
