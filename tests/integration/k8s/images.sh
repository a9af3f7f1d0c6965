#!/usr/bin/env bash
# Copy the Debian test image and corral's own image (built by tests/integration/images/
# build.sh into Docker) into the test cluster's containerd, so Pods run the same images as
# the Docker tests.
set -euo pipefail
SOCK=${CORRAL_CLUSTER_CONTAINERD:-/run/corral-cluster/containerd/containerd.sock}

import_image() {
  local image=$1
  if ctr --address "$SOCK" -n k8s.io images ls -q | grep -qx "docker.io/$image\|$image"; then
    echo "k8s images: $image already in the cluster"
    return
  fi
  docker save "$image" | ctr --address "$SOCK" -n k8s.io images import -
  echo "k8s images: imported $image"
}

import_image "${CORRAL_K8S_TEST_IMAGE:-corral.local/test:bookworm}"
import_image "${CORRAL_K8S_PROBE_IMAGE:-corral.local/holder:bookworm}"
