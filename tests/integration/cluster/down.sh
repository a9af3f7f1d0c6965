#!/usr/bin/env bash
# Tear down the cluster up.sh started: stop every process by its recorded pid, remove its
# containers, network namespaces, bridge and veths, the iptables chains and ipsets that
# kube-router, kubelet and CNI created, its mounts, cgroups and state directories.
# Idempotent; leaves Docker (its containerd, chains and devices) alone.
#   bash tests/integration/cluster/down.sh [--purge]   (--purge also removes the logs)
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PURGE=0
[ "${1:-}" = --purge ] && PURGE=1
[ "$(id -u)" = 0 ] || die "must run as root"

# Binary each recorded pid must be running, so that a recycled pid is never killed.
declare -A EXPECT=(
    [kube-router]=kube-router [kubelet]=kubelet [kube-scheduler]=kube-scheduler
    [kube-controller-manager]=kube-controller-manager [kube-apiserver]=kube-apiserver
    [containerd]=containerd [etcd]=etcd
)

is_ours() { # pid expected-binary-name
    local exe
    exe="$(readlink "/proc/$1/exe" 2>/dev/null)" || return 1
    [ "$(basename "${exe% (deleted)}")" = "$2" ]
}

stop_recorded() { # name
    local name="$1" f="$PID_DIR/$1.pid" pid i
    [ -f "$f" ] || return 0
    pid="$(cat "$f")"
    if is_ours "$pid" "${EXPECT[$name]}"; then
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq 1 40); do
            is_ours "$pid" "${EXPECT[$name]}" || break
            sleep 0.25
        done
        if is_ours "$pid" "${EXPECT[$name]}"; then
            log "$name did not stop on SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null
            sleep 0.2
        fi
    fi
    rm -f "$f"
}

containerd_up() {
    [ -S "$CONTAINERD_SOCK" ] && ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1
}

NETNS=()
collect_netns() {
    # Network namespaces of the pod sandboxes of this containerd.
    local id path
    if containerd_up; then
        for id in $(ctr_ containers ls -q 2>/dev/null); do
            path="$(ctr_ containers info "$id" 2>/dev/null | python3 -c '
import json, sys
try:
    spec = json.load(sys.stdin).get("Spec") or {}
except ValueError:
    sys.exit(0)
for ns in (spec.get("linux") or {}).get("namespaces") or []:
    if ns.get("type") == "network" and ns.get("path"):
        print(ns["path"])
')"
            [ -n "$path" ] && NETNS+=("$path")
        done
    fi
    # And any CRI netns whose interfaces have an address in our pod range (covers a
    # containerd that died before down.sh ran).
    local n prefix="${POD_CIDR%.*}."
    for n in /run/netns/cni-*; do
        [ -e "$n" ] || continue
        ip -n "$(basename "$n")" -4 -o addr show 2>/dev/null | grep -q " inet ${prefix//./\\.}" \
            && NETNS+=("$n")
    done
}

remove_containers() {
    containerd_up || return 0
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
        ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1
    done
    sleep 0.5
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
        ctr_ tasks delete --force "$id" >/dev/null 2>&1
    done
    for id in $(ctr_ containers ls -q 2>/dev/null); do
        ctr_ containers delete "$id" >/dev/null 2>&1
    done
}

kill_leftovers() {
    # Processes still in the pod cgroups kubelet created, and the containerd shims that
    # serve our containerd (their command line names its unique socket/state path).
    local f pid
    for f in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/kubepods; do
        [ -d "$f" ] || continue
        find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
            [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
        done
    done
    for f in /proc/[0-9]*/cmdline; do
        pid="${f#/proc/}"; pid="${pid%/cmdline}"
        if tr '\0' ' ' 2>/dev/null <"$f" | grep -q "containerd-shim.* -address $CONTAINERD_SOCK"; then
            log "killing leftover shim $pid"
            kill -KILL "$pid" 2>/dev/null
        fi
    done
}

clean_network() {
    local n name link
    for n in "${NETNS[@]+"${NETNS[@]}"}"; do
        [ -e "$n" ] || continue
        name="$(basename "$n")"
        ip netns delete "$name" 2>/dev/null || { umount "$n" 2>/dev/null; rm -f "$n"; }
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        for link in $(ip -o link show master "$BRIDGE" | awk -F': ' '{print $2}' | cut -d@ -f1); do
            ip link delete "$link" 2>/dev/null
        done
        ip link delete "$BRIDGE" 2>/dev/null && log "removed bridge $BRIDGE"
    fi
}

clean_iptables() { # iptables|ip6tables
    local ipt="$1" t dump rule chains c
    command -v "$ipt-save" >/dev/null 2>&1 || return 0
    for t in raw mangle nat filter; do
        dump="$("$ipt-save" -t "$t" 2>/dev/null)" || continue
        # Rules in other chains (INPUT, FORWARD, POSTROUTING, ...) that jump to ours.
        while read -r rule; do
            [ -n "$rule" ] || continue
            eval "$ipt -w -t $t -D ${rule#-A }" 2>/dev/null
        done < <(grep -E -- '^-A ' <<<"$dump" | grep -E -- '-j (KUBE-|CNI-)' \
            | grep -vE -- '^-A (KUBE-|CNI-)')
        chains="$(sed -n 's/^:\(\(KUBE-\|CNI-\)[^ ]*\) .*/\1/p' <<<"$dump")"
        for c in $chains; do "$ipt" -w -t "$t" -F "$c" 2>/dev/null; done
        for c in $chains; do "$ipt" -w -t "$t" -X "$c" 2>/dev/null; done
    done
}

clean_ipsets() {
    command -v ipset >/dev/null 2>&1 || return 0
    local s
    for s in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?(KUBE-|kube-router)'); do
        ipset destroy "$s" 2>/dev/null
    done
}

clean_mounts() {
    local m i
    for i in 1 2 3; do
        m="$(awk -v a="$CLUSTER_STATE" -v b="$CLUSTER_RUN" \
            'index($5, a"/") == 1 || $5 == a || index($5, b"/") == 1 || $5 == b {print $5}' \
            /proc/self/mountinfo | sort -r)"
        [ -n "$m" ] || return 0
        while read -r mp; do
            mp="$(printf '%b' "$mp")"  # mountinfo escapes spaces as \040
            umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null
        done <<<"$m"
    done
}

clean_cgroups() {
    local base
    for base in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
        [ -d "$base" ] || continue
        find "$base" -depth -type d -exec rmdir {} \; 2>/dev/null
        [ -d "$base" ] && log "warning: could not remove cgroup $base"
    done
}

clean_pod_log_links() {
    local l
    if [ -d /var/log/containers ]; then
        for l in /var/log/containers/*; do
            [ -L "$l" ] || continue
            case "$(readlink "$l")" in "$CLUSTER_STATE"/*) rm -f "$l" ;; esac
        done
        if [ -f "$CLUSTER_RUN/created-var-log-containers" ]; then
            rmdir /var/log/containers 2>/dev/null
        fi
    fi
}

# Control-plane consumers first, so nothing recreates what is being removed.
for p in kube-router kubelet kube-scheduler kube-controller-manager; do stop_recorded "$p"; done
collect_netns
remove_containers
kill_leftovers
stop_recorded containerd
kill_leftovers
for p in kube-apiserver etcd; do stop_recorded "$p"; done
# Anything else recorded (should be none).
for f in "$PID_DIR"/*.pid; do
    [ -f "$f" ] || continue
    log "warning: unknown pid file $f left alone"
done

clean_network
clean_iptables iptables
clean_iptables ip6tables
clean_iptables iptables-legacy
clean_iptables ip6tables-legacy
clean_ipsets
clean_mounts
clean_cgroups
clean_pod_log_links
rm -rf "$CLUSTER_STATE" "$CLUSTER_RUN"
[ "$PURGE" = 1 ] && rm -rf "$CLUSTER_LOGS"
log "cluster down"
exit 0
