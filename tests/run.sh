#!/usr/bin/env bash
# The whole test suite on a fresh machine: starts what the integration tests need
# (a Docker Engine, the test images, a single-node Kubernetes cluster), runs pytest,
# and stops only what it started. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Preflight: every tool the suite calls, with the Debian package that brings it. What is
# missing is installed here, then each is checked again, so that a fresh machine passes
# and a machine where something was installed by hand hides nothing.
TOOLS=(
  "docker:docker.io" "dockerd:docker.io" "docker-compose:docker-compose"
  "iptables:iptables" "ip6tables:iptables" "debootstrap:debootstrap"
  "busybox:busybox-static" "tini:tini" "nc:netcat-openbsd" "unshare:util-linux"
  "setpriv:util-linux" "ip:iproute2" "git:git" "gcc:gcc" "curl:curl" "ipset:ipset"
  "python3:python3" "ctr:containerd" "sed:sed"
  "conntrack:conntrack" "containerd:containerd" "runc:runc" "openssl:openssl"
  "go:golang-go"
)
preflight() {
  local missing=() entry tool
  for entry in "${TOOLS[@]}"; do
    tool=${entry%%:*}
    command -v "$tool" >/dev/null 2>&1 || missing+=("${entry#*:}")
  done
  if ((${#missing[@]})); then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "tests/run.sh: installing from Debian: ${missing[*]}" >&2
    [ "$(id -u)" = 0 ] || { echo "tests/run.sh: need root to install ${missing[*]}" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || { apt-get -o DPkg::Lock::Timeout=900 update -qq \
        && apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  local absent=()
  for entry in "${TOOLS[@]}"; do
    tool=${entry%%:*}
    command -v "$tool" >/dev/null 2>&1 || absent+=("$tool (Debian: ${entry#*:})")
  done
  if ((${#absent[@]})); then
    echo "tests/run.sh: still missing after install: ${absent[*]}" >&2
    exit 1
  fi
}

command -v uv >/dev/null || python3 -m pip install --quiet uv
preflight
# Debian 12's own Go (1.19, what `golang-go` brings there), beside whatever `go` is, so
# that tests/integration/packaging/test_helper_toolchains.py builds the helper with it:
# it lives in /usr/lib/go-1.19 and changes no `go` on PATH.
if [ ! -x /usr/lib/go-1.19/bin/go ]; then
  [ "$(id -u)" = 0 ] || { echo "tests/run.sh: need root to install golang-1.19-go" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends golang-1.19-go >/dev/null \
    || { apt-get -o DPkg::Lock::Timeout=900 update -qq \
      && apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends golang-1.19-go >/dev/null; }
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
# The exec channel's helper (static Go, into the package's data directory); the Go build
# and module caches live outside the repo, so a rebuild with unchanged sources is quick.
export GOCACHE=${GOCACHE:-$HOME/.cache/go-build} GOMODCACHE=${GOMODCACHE:-$HOME/go/pkg/mod}
bash helper/build.sh
(cd helper && go test ./...)  # the NFLOG reader's packet parser, hostile input
# SWE-ReX's own runtime tests (in its sdist, not its wheel: the locked version's, checked
# against uv.lock's hash) for tests/integration/adapters/test_swerex_upstream.py.
bash tests/integration/adapters/swerex_sdist.sh >/dev/null

# The test cluster is built from upstream sources on first use (cold: ~26 min).
started_cluster=1
bash tests/integration/cluster/up.sh
bash tests/integration/k8s/images.sh
export KUBECONFIG=${KUBECONFIG:-/var/lib/corral-cluster/admin.kubeconfig}

uv run --all-extras --frozen pytest --durations=25 "$@" \
  || { rc=$?; bash tests/integration/docker/engine.sh hung; exit "$rc"; }

# AgentCompass (and Harbor) need Python >= 3.12: the unit tests and the adapter tests that
# need it run again in a 3.12 environment from the same lock file.
. tests/python312.sh
if [ $# = 0 ]; then
  if py312=$(python312); then
    UV_PROJECT_ENVIRONMENT=.venv-3.12 uv sync --python "$py312" --all-extras --frozen --quiet
    .venv-3.12/bin/python -m pytest -p no:cacheprovider tests/unit \
      tests/integration/adapters/test_agentcompass_docker.py \
      tests/integration/adapters/test_harbor.py
  elif [ "${CI:-}" = true ]; then
    echo "tests/run.sh: no Python 3.12 found (PATH or pyenv); the 3.12 stage cannot run" >&2
    exit 1
  else
    echo "tests/run.sh: skipping the Python 3.12 stage: no python3.12 on PATH or in pyenv" >&2
  fi
fi

if [ $# = 0 ]; then
  # It restarts dockerd (stopping every container, the egress targets too): alone, last.
  uv run --all-extras --frozen pytest -m engine_restart \
    tests/integration/docker/test_docker_engine_restart.py
fi
