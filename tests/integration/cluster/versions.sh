# Component versions for the local test cluster (sourced by build.sh, up.sh, down.sh).
# Binaries are cached under $CORRAL_CLUSTER_CACHE/<component>-<version>/, keyed by these.
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
# gVisor publishes no tags to the module proxy: this is its `go` branch as the proxy's
# @latest served it on 2026-12-06.
GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
PAUSE_IMAGE_VERSION="1"
# kwok: fake nodes for the bench's thousands-of-sandboxes rows (not the test cluster).
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"

CORRAL_CLUSTER_CACHE="${CORRAL_CLUSTER_CACHE:-/var/cache/corral/cluster}"
CORRAL_GO_CACHE="${CORRAL_GO_CACHE:-/var/cache/corral/go}"

K8S_BIN="$CORRAL_CLUSTER_CACHE/kubernetes-$KUBERNETES_VERSION/bin"
ETCD_BIN="$CORRAL_CLUSTER_CACHE/etcd-$ETCD_VERSION/bin"
KUBE_ROUTER_BIN="$CORRAL_CLUSTER_CACHE/kube-router-$KUBE_ROUTER_VERSION/bin"
GVISOR_BIN="$CORRAL_CLUSTER_CACHE/gvisor-$GVISOR_VERSION/bin"
KWOK_BIN="$CORRAL_CLUSTER_CACHE/kwok-$KWOK_VERSION/bin"
IMAGES_DIR="$CORRAL_CLUSTER_CACHE/images-$PAUSE_IMAGE_VERSION"

PAUSE_IMAGE="corral.local/pause:$PAUSE_IMAGE_VERSION"
TEST_IMAGE="corral.local/test:busybox"
