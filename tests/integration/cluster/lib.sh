# Shared settings of up.sh and down.sh (sourced, not run).
# shellcheck shell=bash
# shellcheck source=versions.sh
. "$(dirname "${BASH_SOURCE[0]}")/versions.sh"

# Everything the cluster writes at run time lives under these two directories (plus the
# logs directory), so that down.sh can remove it all and nothing collides with Docker's
# containerd (/run/containerd, /var/lib/containerd, /var/run/docker).
CLUSTER_STATE="${CORRAL_CLUSTER_STATE:-/var/lib/corral-cluster}"
CLUSTER_RUN="${CORRAL_CLUSTER_RUN:-/run/corral-cluster}"
CLUSTER_LOGS="${CORRAL_CLUSTER_LOGS:-/var/log/corral-cluster}"
PID_DIR="$CLUSTER_RUN/pids"
ADMIN_KUBECONFIG="$CLUSTER_STATE/admin.kubeconfig"

NODE_NAME="${CORRAL_CLUSTER_NODE_NAME:-corral-node}"
# 10.244.0.0/16 for pods (the node gets the first /24) and 10.96.0.0/16 for Services:
# neither collides with Docker's 172.16.0.0/12 nor with this machine's routes.
CLUSTER_CIDR="${CORRAL_CLUSTER_CIDR:-10.244.0.0/16}"
POD_CIDR="${CORRAL_POD_CIDR:-10.244.0.0/24}"
SERVICE_CIDR="${CORRAL_SERVICE_CIDR:-10.96.0.0/16}"
SERVICE_IP="${CORRAL_SERVICE_IP:-10.96.0.1}"
BRIDGE="${CORRAL_CLUSTER_BRIDGE:-corral-cni0}"

ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
APISERVER_PORT="${CORRAL_APISERVER_PORT:-6443}"

CONTAINERD_SOCK="$CLUSTER_RUN/containerd/containerd.sock"
CNI_BIN_DIR=/usr/lib/cni
CNI_CONF_DIR="$CLUSTER_STATE/cni/net.d"

log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ctr_() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
