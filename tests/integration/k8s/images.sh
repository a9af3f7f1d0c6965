#!/usr/bin/env bash
# Copy the Debian test image (built by tests/integration/images/build.sh into Docker)
# into the test cluster's containerd, so Pods run the same image as the Docker tests.
set -euo pipefail
SOCK=${CORRAL_CLUSTER_CONTAINERD:-/run/corral-cluster/containerd/containerd.sock}
IMAGE=${CORRAL_K8S_TEST_IMAGE:-corral.local/test:bookworm}
if ctr --address "$SOCK" -n k8s.io images ls -q | grep -qx "docker.io/$IMAGE\|$IMAGE"; then
  echo "k8s images: $IMAGE already in the cluster"
  exit 0
fi
docker save "$IMAGE" | ctr --address "$SOCK" -n k8s.io images import -
echo "k8s images: imported $IMAGE"
