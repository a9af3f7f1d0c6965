#!/usr/bin/env bash
# Start/stop a Docker engine for corral's integration tests.
#
#   engine.sh up      install docker.io/iptables/debootstrap/busybox-static from
#                     Debian if missing; start dockerd unless one already answers
#   engine.sh down    stop dockerd, but only if `up` started it (recorded pid)
#   engine.sh restart down then up, only for a dockerd `up` started (the engine
#                     restart test; it refuses a daemon it did not start)
#   engine.sh status  say whether the daemon answers and who started it
#
# Idempotent. `up` never touches a daemon it did not start; `down` never kills
# anything but the pid `up` recorded.
#
# Environment:
#   CORRAL_DOCKERD_LOG      dockerd log          (/var/log/corral-dockerd.log)
#   CORRAL_DOCKERD_PIDFILE  pid of our dockerd   (/run/corral-dockerd.pid)
#   CORRAL_DOCKERD_WAIT_S   readiness bound, s   (60)
#   CORRAL_DOCKER_POOL      default-address-pools base (10.201.0.0/16)
#   CORRAL_DOCKER_POOL_SIZE prefix length of each network in it (28)
#   CORRAL_DOCKER_IPV6_CIDR fixed-cidr-v6 of the default bridge (fd00:c0:ffee::/64)
#
# Address plan (see `ip route` on the test machine: host uses 192.0.2.0/24 and
# fd00::/64): the daemon's default bridge is 10.200.0.1/24, networks the daemon
# allocates itself (compose, `docker network create` without --subnet) come
# from 10.201.0.0/16 in /28 slices (4096 networks). corral's own sandbox
# networks should use explicit subnets from a different range (e.g.
# 10.202.0.0/16) so that neither side collides with the other.
set -euo pipefail

LOG=${CORRAL_DOCKERD_LOG:-/var/log/corral-dockerd.log}
PIDFILE=${CORRAL_DOCKERD_PIDFILE:-/run/corral-dockerd.pid}
WAIT_S=${CORRAL_DOCKERD_WAIT_S:-60}
POOL=${CORRAL_DOCKER_POOL:-10.201.0.0/16}
POOL_SIZE=${CORRAL_DOCKER_POOL_SIZE:-28}
BIP=${CORRAL_DOCKER_BIP:-10.200.0.1/24}
V6CIDR=${CORRAL_DOCKER_IPV6_CIDR:-fd00:c0:ffee::/64}
CONFIG=${CORRAL_DOCKERD_CONFIG:-/etc/docker/daemon.json}
# Marker: `up` found a daemon it did not start (so `down` leaves it alone).
FOREIGN_MARK=/run/corral-dockerd.foreign
# The test-only runtime `corral-test-bypass` (see bypass-runtime.sh), registered in our
# daemon.json: installed outside the clone, which may move or go.
BYPASS_RUNTIME=/usr/local/libexec/corral-test/bypass-runtime
# gVisor, registered as the runtime `runsc`: its network stack skips the namespace's rules,
# so corral puts it behind a gateway (providers/docker/gateway.py) and catches it without
# one (test_docker_adversarial.py). The cluster's build (Debian's 2022 runsc cannot join
# another container's network namespace). `--overlay2=none`: the sandbox's writes go to
# the container's filesystem, where the engine's archive calls (corral's file transfers)
# see them, not to a layer of gVisor's own that only the sandbox sees. `--debug-log`: each
# runsc command's log (info level) in $RUNSC_LOGS, so a start that hangs can be read after.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../cluster/versions.sh
. "$HERE/../cluster/versions.sh"
RUNSC=$GVISOR_BIN/runsc
RUNSC_LOGS=/var/log/corral-runsc/

log() { printf 'engine.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

docker_answers() { timeout 10 docker info >/dev/null 2>&1; }

our_pid() {
    # Prints the recorded pid if that process is still a dockerd.
    [[ -s $PIDFILE ]] || return 1
    local pid
    pid=$(<"$PIDFILE")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/comm && $(</proc/"$pid"/comm) == dockerd ]] || return 1
    printf '%s\n' "$pid"
}

install_missing() {
    local pkgs=()
    command -v dockerd >/dev/null || pkgs+=(docker.io)
    command -v iptables >/dev/null || pkgs+=(iptables)
    command -v debootstrap >/dev/null || pkgs+=(debootstrap)
    [[ -x /bin/busybox ]] || pkgs+=(busybox-static)
    command -v tini >/dev/null || pkgs+=(tini)
    command -v docker-compose >/dev/null || pkgs+=(docker-compose)
    if ((${#pkgs[@]})); then
        log "installing from Debian: ${pkgs[*]}"
        [[ $(id -u) == 0 ]] || die "need root to install ${pkgs[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 \
            install -y --no-install-recommends "${pkgs[@]}" >&2
    fi
    command -v docker >/dev/null || die "no docker client on PATH after install"
}

write_config() {
    # Written only when absent or when it is ours (carries the marker label;
    # dockerd rejects unknown keys), so a hand-made daemon.json is kept.
    if [[ -e $CONFIG ]] && ! grep -q 'corral-managed=engine.sh' "$CONFIG" 2>/dev/null; then
        log "keeping existing $CONFIG (not written by engine.sh)"
        return 1
    fi
    mkdir -p "$(dirname "$CONFIG")" "$(dirname "$BYPASS_RUNTIME")"
    install -m 755 "$HERE/bypass-runtime.sh" "$BYPASS_RUNTIME"
    cat >"$CONFIG.tmp" <<EOF
{
  "labels": ["corral-managed=engine.sh"],
  "bip": "$BIP",
  "default-address-pools": [{"base": "$POOL", "size": $POOL_SIZE}],
  "ipv6": true,
  "fixed-cidr-v6": "$V6CIDR",
  "experimental": true,
  "ip6tables": true,
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "2"},
  "runtimes": {
    "corral-test-bypass": {"path": "$BYPASS_RUNTIME"},
    "runsc": {"path": "$RUNSC", "runtimeArgs": ["--overlay2=none", "--debug-log=$RUNSC_LOGS"]}
  }
}
EOF
    if cmp -s "$CONFIG.tmp" "$CONFIG"; then
        rm "$CONFIG.tmp"
        return 1
    fi
    mv "$CONFIG.tmp" "$CONFIG"
}

ensure_runsc() {
    [[ -x $RUNSC ]] && return 0
    log "building gVisor's runsc (tests/integration/cluster/build.sh gvisor)"
    bash "$HERE/../cluster/build.sh" gvisor >&2 || die "building runsc failed"
}

cmd_up() {
    install_missing
    ensure_runsc
    if docker_answers; then
        if our_pid >/dev/null; then
            log "dockerd already running (started by engine.sh, pid $(our_pid))"
            if write_config; then
                # Runtimes are among the settings dockerd reloads on SIGHUP.
                kill -HUP "$(our_pid)"
                log "reloaded $CONFIG"
            fi
        else
            log "a docker daemon already answers; not starting one (down will leave it alone)"
            : >"$FOREIGN_MARK"
        fi
        return 0
    fi
    rm -f "$FOREIGN_MARK"
    rm -f "$RUNSC_LOGS"runsc.log.*  # an earlier engine's, so `hung` reads only this one's
    if pid=$(our_pid); then
        die "dockerd pid $pid (ours) is alive but does not answer; see $LOG"
    fi
    write_config || true
    log "starting dockerd (log $LOG, pid file $PIDFILE)"
    mkdir -p "$(dirname "$LOG")" "$(dirname "$PIDFILE")"
    # setsid: own session, so the caller's terminal signals cannot reach it.
    # dockerd writes its own pid to $PIDFILE (and removes it on clean exit);
    # we also write $! at once so a failed start can still be cleaned up.
    rm -f "$PIDFILE"
    setsid dockerd --config-file "$CONFIG" --pidfile "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
    local pid=$!
    local t0=$SECONDS
    until docker_answers; do
        if ! kill -0 "$pid" 2>/dev/null && ! our_pid >/dev/null; then
            rm -f "$PIDFILE"
            tail -n 30 "$LOG" >&2 || true
            die "dockerd exited during startup; see $LOG"
        fi
        if ((SECONDS - t0 >= WAIT_S)); then
            tail -n 30 "$LOG" >&2 || true
            die "dockerd (pid $pid) did not answer within ${WAIT_S}s; see $LOG (still running; 'engine.sh down' stops it)"
        fi
        sleep 0.5
    done
    pid=$(our_pid) || die "dockerd answers but $PIDFILE does not name a dockerd"
    log "dockerd ready in $((SECONDS - t0))s (pid $pid, server $(docker version -f '{{.Server.Version}}' 2>/dev/null))"
}

cmd_down() {
    local pid
    if ! pid=$(our_pid); then
        rm -f "$PIDFILE"
        if [[ -e $FOREIGN_MARK ]]; then
            log "the daemon was not started by engine.sh; leaving it running"
        else
            log "no dockerd started by engine.sh is running"
        fi
        return 0
    fi
    log "stopping dockerd pid $pid"
    kill -TERM "$pid"
    local t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - t0 >= 30)); then
            log "dockerd pid $pid ignored SIGTERM for 30s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.5
    done
    rm -f "$PIDFILE"
    log "dockerd stopped"
}

cmd_status() {
    if docker_answers; then
        if pid=$(our_pid); then echo "running (engine.sh, pid $pid)"; else echo "running (not started by engine.sh)"; fi
    else
        echo "not answering"
        return 1
    fi
}

cmd_restart() {
    # Only a daemon this script started: a user's engine is never restarted by the tests.
    our_pid >/dev/null || die "dockerd was not started by engine.sh; not restarting it"
    cmd_down
    cmd_up
}

# runsc commands that create or start a container and never ended (their log has no exit
# status): the tail of each, newest last. tests/run.sh prints them when pytest fails.
cmd_hung() {
    local f
    grep -L "Exiting with status" "$RUNSC_LOGS"*.create.txt "$RUNSC_LOGS"*.start.txt \
        2>/dev/null | sort | tail -n 3 | while read -r f; do
        log "runsc never finished: $f"
        tail -n 12 "$f" | cut -c1-240 >&2
    done
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    restart) cmd_restart ;;
    status) cmd_status ;;
    hung) cmd_hung ;;
    *) echo "usage: $0 up|down|restart|status|hung" >&2; exit 2 ;;
esac
