#!/usr/bin/env bash
# Build corral's exec-channel helper (a static Go binary, no cgo) for the sandbox
# architectures corral ships it for, into the package's data directory. `pip install`
# never needs this: without the binary corral falls back to plain exec (and says so).
# The Go build cache lives outside the repo (GOCACHE, default ~/.cache/go-build).
set -euo pipefail
cd "$(dirname "$0")"
out=../src/corral/helper/bin
mkdir -p "$out"
for arch in ${CORRAL_HELPER_ARCHS:-amd64 arm64}; do
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOFLAGS=-mod=mod \
    go build -trimpath -buildvcs=false -ldflags='-s -w -E main.rt0' -o "$out/corral-exec-linux-$arch.tmp" .
  mv "$out/corral-exec-linux-$arch.tmp" "$out/corral-exec-linux-$arch"
done
