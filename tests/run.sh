#!/usr/bin/env bash
# The whole test suite on a fresh machine: starts what the integration tests need
# (a Docker Engine, the test images, a single-node Kubernetes cluster), runs pytest,
# and stops only what it started. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v uv >/dev/null || python3 -m pip install --quiet uv
if ! command -v nc >/dev/null || ! command -v unshare >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq netcat-openbsd util-linux iproute2 >/dev/null
fi
uv sync --all-extras --frozen --quiet

started_engine=0
started_cluster=0
cleanup() {
  if [ "$started_cluster" = 1 ]; then bash tests/integration/cluster/down.sh || true; fi
  if [ "$started_engine" = 1 ]; then bash tests/integration/docker/engine.sh down || true; fi
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then started_engine=1; fi
bash tests/integration/docker/engine.sh up
bash tests/integration/images/build.sh

# The test cluster is built from upstream sources on first use (cold: ~26 min).
started_cluster=1
bash tests/integration/cluster/up.sh
bash tests/integration/k8s/images.sh
export KUBECONFIG=${KUBECONFIG:-/var/lib/corral-cluster/admin.kubeconfig}

uv run --all-extras --frozen pytest "$@"
