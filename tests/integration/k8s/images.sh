#!/usr/bin/env bash
# Copy the Debian test image and corral's holder image (the Pods' corral-probe
# container; both built by tests/integration/images/build.sh into Docker) into the test
# cluster's containerd, so Pods run the same images as the Docker tests.
set -euo pipefail
SOCK=${CORRAL_CLUSTER_CONTAINERD:-/run/corral-cluster/containerd/containerd.sock}
IMAGES=("${CORRAL_K8S_TEST_IMAGE:-corral.local/test:bookworm}"
  "${CORRAL_K8S_PROBE_IMAGE:-corral.local/holder:bookworm}")
present=$(ctr --address "$SOCK" -n k8s.io images ls -q)
for image in "${IMAGES[@]}"; do
  if grep -qx "docker.io/$image\|$image" <<<"$present"; then
    echo "k8s images: $image already in the cluster"
    continue
  fi
  docker save "$image" | ctr --address "$SOCK" -n k8s.io images import -
  echo "k8s images: imported $image"
done
