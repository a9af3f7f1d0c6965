#!/usr/bin/env bash
# Build corral's Docker test images without any container registry.
#
#   build.sh [--force] [--key] [test|holder ...]     (default: test holder)
#
# Images (both Debian bookworm, from `debootstrap --variant=minbase`):
#   corral.local/test:bookworm    sandbox image for the integration tests:
#                                 ps, ip, nc (openbsd), ping, getent, tar, bash,
#                                 iptables (to show a root agent cannot use it),
#                                 python3 (full stdlib), busybox at
#                                 /usr/local/bin/busybox, user corral (1000:1000).
#                                 CMD ["sleep","infinity"].
#   corral.local/holder:bookworm  network-namespace holder: iptables(-restore),
#                                 ip6tables(-restore) on the nf_tables backend,
#                                 busybox (nc/ip/wget for probes), tini.
#                                 ENTRYPOINT tini -s --, CMD sleep infinity.
#                                 The equivalent of
#                                 src/corral/providers/docker/holder/Dockerfile.
#
# Two keys per image, both hashes of the code that makes it (`declare -f` of
# the recipe functions, the package list, suite, architecture), not of this
# file's bytes:
#   rootfs key  names the cache entry $CACHE/<rootfs key>/rootfs.tar
#   image key   rootfs key + import config; carried as label corral.image.key
# Work is skipped at three levels:
#   1. the tag exists with the right image key label    -> nothing to do (~0.2 s)
#   2. $CACHE/<rootfs key>/rootfs.tar exists            -> docker import only (~8 s)
#   3. otherwise debootstrap (downloaded .debs are kept in $CACHE/debs)
# --force rebuilds the root filesystem and re-imports.
# --key prints "<image> <image-key> <rootfs-key> <tag>" lines and exits.
#
# Needs root (debootstrap, chroot) and a docker daemon that answers
# (tests/integration/docker/engine.sh up). Concurrent runs serialize on a lock.
#
# Environment:
#   CORRAL_IMAGE_CACHE     cache root (/var/cache/corral/images)
#   CORRAL_DEBIAN_MIRROR   Debian mirror (default: the one apt uses for the
#                          suite, else http://deb.debian.org/debian). Not part
#                          of the key.
set -euo pipefail

SUITE=bookworm
CACHE=${CORRAL_IMAGE_CACHE:-/var/cache/corral/images}
SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
ARCH=$(dpkg --print-architecture)
# Bump to force a rebuild of every image without changing anything else.
EPOCH=1

TEST_TAG=corral.local/test:$SUITE
HOLDER_TAG=corral.local/holder:$SUITE
# minbase already has bash, coreutils, tar, libc-bin (getent), dash (sh).
TEST_PACKAGES=procps,iproute2,netcat-openbsd,iputils-ping,iptables,ca-certificates,busybox-static,python3,tini
HOLDER_PACKAGES=iptables,iproute2,ipset,busybox-static,tini
STD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '[build.sh %6.1fs] %s\n' "$(elapsed)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
T0=$EPOCHREALTIME
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

detect_mirror() {
    local f uri
    # deb822 first (Debian 12 default), then one-line sources.
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        uri=$(awk -v s="$SUITE" '
            /^URIs:/ {u=$2} /^Suites:/ {for (i=2;i<=NF;i++) if ($i==s) ok=1}
            /^$/ {if (ok && u) {print u; exit} ok=0; u=""}
            END {if (ok && u) print u}' "$f" | head -n1)
        [[ -n $uri ]] && { echo "${uri%/}"; return; }
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        uri=$(awk -v s="$SUITE" '$1=="deb" && $0 !~ /^#/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/ && $(i+1)==s) {print $i; exit}}' "$f")
        [[ -n $uri ]] && { echo "${uri%/}"; return; }
    done
    echo http://deb.debian.org/debian
}

image_packages() { case $1 in test) echo "$TEST_PACKAGES" ;; holder) echo "$HOLDER_PACKAGES" ;; esac; }

# Keys hash the code that makes the image, not this file's bytes: `declare -f`
# prints function bodies without comments, so editing comments, or one image's
# recipe, rebuilds nothing else.
rootfs_key() { # name: what goes into $CACHE/<key>/rootfs.tar
    {
        printf '%s\n' "$1" "$SUITE" "$ARCH" "$EPOCH" "$(image_packages "$1")"
        declare -f build_rootfs customize_common "customize_$1"
    } | sha256sum | cut -c1-16
}
image_key() { # name: rootfs plus the image config set at import
    { rootfs_key "$1"; echo "$STD_PATH"; declare -f import_image; } | sha256sum | cut -c1-16
}

image_tag() { case $1 in test) echo "$TEST_TAG" ;; holder) echo "$HOLDER_TAG" ;; esac; }

imported_key() { # tag
    docker image inspect -f '{{index .Config.Labels "corral.image.key"}}' "$1" 2>/dev/null || true
}

# ---- root filesystem -------------------------------------------------------

remove_tree() { # dir: unmount whatever is mounted below it, then delete it
    local m
    # debootstrap mounts proc/sys (and may bind /dev) inside the target.
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v w="$1/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    rm -rf --one-file-system "$1"
}

WORK=""
cleanup_work() {
    [[ -n $WORK && -d $WORK ]] && remove_tree "$WORK"
    WORK=""
}
trap cleanup_work EXIT
trap 'exit 130' INT TERM

customize_common() { # rootfs
    local r=$1
    # Docker bind-mounts these at run time; do not leak the build host's.
    : >"$r/etc/resolv.conf"
    : >"$r/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
    : >"$r/etc/machine-id"
    rm -f "$r/var/lib/dbus/machine-id"
    # Slim like debian:*-slim: no docs, man pages, locales, apt lists/caches.
    rm -rf "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* \
        "$r"/usr/share/locale/* "$r"/usr/share/lintian/* \
        "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
        "$r"/var/log/*.log "$r"/var/log/apt/* "$r"/debootstrap
    mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
    cat >"$r/etc/dpkg/dpkg.cfg.d/corral-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    ln -sf /bin/busybox "$r/usr/local/bin/busybox"
}

customize_test() { # rootfs
    local r=$1
    customize_common "$r"
    # Non-root user for tests that run as non-root. Written directly: no
    # dependency on useradd inside the chroot.
    grep -q '^corral:' "$r/etc/passwd" || {
        echo 'corral:x:1000:1000:corral test user:/home/corral:/bin/bash' >>"$r/etc/passwd"
        echo 'corral:x:1000:' >>"$r/etc/group"
        echo 'corral:*:19000:0:99999:7:::' >>"$r/etc/shadow"
    }
    # No file capabilities on ping: with them, exec fails (EPERM) in a sandbox
    # started with --cap-drop ALL; without them iputils uses ICMP datagram
    # sockets, which Docker allows (net.ipv4.ping_group_range).
    chroot "$r" python3 -c 'import os; os.removexattr("/usr/bin/ping", "security.capability")'
    install -d -m 0755 -o 1000 -g 1000 "$r/home/corral"
    cp -a "$r/etc/skel/." "$r/home/corral/" 2>/dev/null || true
    chown -R 1000:1000 "$r/home/corral"
}

customize_holder() { # rootfs
    local r=$1
    customize_common "$r"
    # nf_tables backend: works inside a container netns on this kernel for v4
    # and v6 (legacy does too); nft is Debian's default and the only one left
    # on kernels built without CONFIG_IP_NF_IPTABLES. See README.md.
    chroot "$r" update-alternatives --set iptables /usr/sbin/iptables-nft >/dev/null
    chroot "$r" update-alternatives --set ip6tables /usr/sbin/ip6tables-nft >/dev/null
    # The holder needs nothing from apt/perl at run time, but removing them is
    # fragile and saves little; keep the filesystem a plain Debian one.
}

build_rootfs() { # name rootfs-key
    local name=$1 key=$2 out=$CACHE/$2 packages
    packages=$(image_packages "$name")
    local mirror
    mirror=${CORRAL_DEBIAN_MIRROR:-$(detect_mirror)}
    mkdir -p "$CACHE/debs"
    WORK=$(mktemp -d "$CACHE/tmp.$name.XXXXXX")
    log "$name: debootstrap --variant=minbase $SUITE from $mirror (+ $packages)"
    if ! debootstrap --variant=minbase --include="$packages" \
        --cache-dir="$CACHE/debs" --arch="$ARCH" \
        "$SUITE" "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 40 "$WORK/debootstrap.log" >&2
        [[ -r $WORK/rootfs/debootstrap/debootstrap.log ]] &&
            tail -n 40 "$WORK/rootfs/debootstrap/debootstrap.log" >&2
        die "$name: debootstrap failed (log above)"
    fi
    log "$name: debootstrap done; customizing"
    "customize_$name" "$WORK/rootfs"
    log "$name: packing rootfs.tar"
    # Keep xattrs (iputils-ping's file capability); leave /dev, /proc, /sys,
    # /run empty: the runtime provides them.
    tar --numeric-owner --xattrs --xattrs-include='*' --one-file-system \
        --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' \
        -C "$WORK/rootfs" -cf "$WORK/rootfs.tar" .
    {
        echo "image=$name"
        echo "key=$key"
        echo "suite=$SUITE"
        echo "arch=$ARCH"
        echo "mirror=$mirror"
        echo "packages=$packages"
        echo "built=$(date -u +%FT%TZ)"
    } >"$WORK/meta"
    rm -rf "$out.old"
    [[ -e $out ]] && mv "$out" "$out.old"
    mkdir -p "$out"
    mv "$WORK/rootfs.tar" "$WORK/meta" "$WORK/debootstrap.log" "$out/"
    rm -rf "$out.old"
    cleanup_work
    # Drop root filesystems of this image built by earlier versions of this script.
    local d
    for d in "$CACHE"/*/meta; do
        [[ $d == "$out/meta" ]] && continue
        grep -qx "image=$name" "$d" 2>/dev/null && remove_tree "${d%/meta}"
    done
    log "$name: cached $out/rootfs.tar ($(du -h "$out/rootfs.tar" | cut -f1))"
}

import_image() { # name image-key rootfs-key
    local name=$1 key=$2 rkey=$3 tag
    tag=$(image_tag "$name")
    local changes=(
        --change "ENV PATH=$STD_PATH"
        --change "ENV LANG=C.UTF-8"
        --change "LABEL corral.image.key=$key"
        --change "LABEL corral.image.name=$name"
        --change "LABEL corral.rootfs.key=$rkey"
        --change "LABEL org.opencontainers.image.description=corral-test-infrastructure"
        --change 'CMD ["sleep","infinity"]'
    )
    case $name in
        holder) changes+=(--change 'ENTRYPOINT ["/usr/bin/tini","-s","--"]') ;;
    esac
    local old_id new_id
    old_id=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
    log "$name: docker import -> $tag"
    new_id=$(docker import "${changes[@]}" --message "corral $name image, key $key" \
        "$CACHE/$rkey/rootfs.tar" "$tag")
    # The previous build is now untagged; drop it unless a container uses it.
    if [[ -n $old_id && $old_id != "$new_id" ]]; then
        docker image rm "$old_id" >/dev/null 2>&1 || log "$name: kept previous image $old_id (in use)"
    fi
}

ensure_image() { # name
    local name=$1 key rkey tag t
    key=$(image_key "$name")
    rkey=$(rootfs_key "$name")
    tag=$(image_tag "$name")
    t=$(elapsed)
    if ((!FORCE)) && [[ $(imported_key "$tag") == "$key" ]]; then
        log "$name: $tag is up to date (key $key)"
        return
    fi
    if ((FORCE)) || [[ ! -s $CACHE/$rkey/rootfs.tar ]]; then
        build_rootfs "$name" "$rkey"
    else
        log "$name: using cached $CACHE/$rkey/rootfs.tar"
    fi
    import_image "$name" "$key" "$rkey"
    [[ $(imported_key "$tag") == "$key" ]] || die "$name: $tag does not carry key $key after import"
    log "$name: $tag ready (key $key, $(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=iec), step took $(awk -v a="$t" -v b="$(elapsed)" 'BEGIN {printf "%.1f", b - a}')s)"
}

FORCE=0
PRINT_KEY=0
names=()
for arg in "$@"; do
    case $arg in
        --force) FORCE=1 ;;
        --key) PRINT_KEY=1 ;;
        test | holder) names+=("$arg") ;;
        -h | --help) sed -n '2,/^set -euo/p' "$SCRIPT" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (usage: build.sh [--force] [--key] [test|holder ...])" ;;
    esac
done
((${#names[@]})) || names=(test holder)

if ((PRINT_KEY)); then
    for n in "${names[@]}"; do echo "$n $(image_key "$n") $(rootfs_key "$n") $(image_tag "$n")"; done
    exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root (debootstrap and chroot need it)"
command -v debootstrap >/dev/null || die "debootstrap missing: tests/integration/docker/engine.sh up installs it"
timeout 10 docker info >/dev/null 2>&1 || die "docker daemon does not answer: run tests/integration/docker/engine.sh up"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
# Leftovers of a build that was killed hard; no build runs now (we hold the lock).
for d in "$CACHE"/tmp.*; do
    [[ -d $d ]] && { log "removing stale $d"; remove_tree "$d"; }
done
for n in "${names[@]}"; do ensure_image "$n"; done
log "done"
