#!/usr/bin/env bash
# Smoke test of the holder/sandbox enforcement pattern with plain docker
# commands (no corral code): the holder owns the netns with NET_ADMIN, the
# sandbox joins it with no capabilities, rules go in through
# `docker exec -i holder iptables-restore`.
#
#   smoke_holder.sh          (needs engine.sh up and images/build.sh)
#
# Prints every docker command with its duration; exits non-zero on the first
# unexpected result. Removes everything it created, by exact id.
set -euo pipefail

HOLDER_IMAGE=${CORRAL_HOLDER_IMAGE:-corral.local/holder:bookworm}
TEST_IMAGE=${CORRAL_TEST_IMAGE:-corral.local/test:bookworm}
# Explicit subnets (as corral will use), outside the daemon's pools (engine.sh:
# bip 10.200.0.0/24, pool 10.201.0.0/16) and the range suggested for corral
# (10.202.0.0/16).
SUBNET4=${CORRAL_SMOKE_SUBNET4:-10.200.255.240/28}
SUBNET6=${CORRAL_SMOKE_SUBNET6:-fd00:c0:ffee:ff::/64}
IPV6=${CORRAL_SMOKE_IPV6:-1}

containers=()
network=""
cleanup() {
    local rc=$?
    ((${#containers[@]})) && docker rm -f "${containers[@]}" >/dev/null 2>&1 || true
    [[ -n $network ]] && docker network rm "$network" >/dev/null 2>&1 || true
    if ((rc)); then echo "SMOKE FAILED (rc $rc)" >&2; fi
    exit "$rc"
}
trap cleanup EXIT

ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
# run CMD...: echo, run, print duration; output goes to $OUT, status to $RC.
run() {
    local t0 t1
    t0=$(ms)
    set +e
    OUT=$("$@" 2>&1)
    RC=$?
    set -e
    t1=$(ms)
    printf '$ %s\n  -> rc=%s in %s ms%s\n' "$*" "$RC" "$((t1 - t0))" "${OUT:+: ${OUT//$'\n'/ | }}"
}
expect_ok() { ((RC == 0)) || { echo "  !! expected success" >&2; exit 1; }; }
expect_fail() { ((RC != 0)) || { echo "  !! expected failure" >&2; exit 1; }; }
# A refused/rejected connection must fail well before nc's 2 s timeout.
expect_fast_fail() {
    expect_fail
    local took=${LAST_MS:-0}
    ((took < 1500)) || { echo "  !! failed only after ${took} ms (timeout, not a reject)" >&2; exit 1; }
}
timed() { local t0; t0=$(ms); run "$@"; LAST_MS=$(($(ms) - t0)); }

net_args=(--subnet "$SUBNET4")
((IPV6)) && net_args+=(--ipv6 --subnet "$SUBNET6")
run docker network create "${net_args[@]}" corral-smoke-$$; expect_ok
network=$OUT

run docker run -d --network "$network" "$TEST_IMAGE" busybox httpd -f -p 80; expect_ok
server=$OUT; containers+=("$server")
server4=$(docker inspect -f "{{(index .NetworkSettings.Networks \"corral-smoke-$$\").IPAddress}}" "$server")
server6=$(docker inspect -f "{{(index .NetworkSettings.Networks \"corral-smoke-$$\").GlobalIPv6Address}}" "$server")
echo "server: $server4 ${server6:-"(no IPv6)"}"

run docker run -d --network "$network" --cap-add NET_ADMIN "$HOLDER_IMAGE"; expect_ok
holder=$OUT; containers+=("$holder")

# --init: `sleep infinity` as PID 1 ignores SIGTERM, so without it
# `docker stop` waits the whole grace period (10 s).
run docker run -d --init --network "container:$holder" --cap-drop ALL \
    --security-opt no-new-privileges "$TEST_IMAGE"; expect_ok
sandbox=$OUT; containers+=("$sandbox")

echo "== before rules"
timed docker exec "$sandbox" nc -z -w2 "$server4" 80; expect_ok
[[ -n $server6 ]] && { timed docker exec "$sandbox" nc -6 -z -w2 "$server6" 80; expect_ok; }
# No file capability on ping in the test image: works without NET_RAW.
timed docker exec "$sandbox" ping -c1 -W1 "$server4"; expect_ok
timed docker exec --user 1000 "$sandbox" ping -c1 -W1 "$server4"; expect_ok

payload4='*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -o lo -j ACCEPT
-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited
COMMIT
'
# TCP gets a reset: an ICMP reject of a locally generated SYN reaches an IPv6
# (or blocking IPv4) connect() only with the SYN retransmit, ~1 s later
# (measured on kernel 6.18; see README.md).
payload6=${payload4//icmp-admin-prohibited/icmp6-adm-prohibited}

echo "== apply rules through the holder"
run docker exec -i "$holder" iptables-restore <<<"$payload4"; expect_ok
[[ -n $server6 ]] && { run docker exec -i "$holder" ip6tables-restore <<<"$payload6"; expect_ok; }
run docker exec "$holder" iptables -S OUTPUT; expect_ok

echo "== after rules"
timed docker exec "$sandbox" nc -z -w2 "$server4" 80; expect_fast_fail
[[ -n $server6 ]] && { timed docker exec "$sandbox" nc -6 -z -w2 "$server6" 80; expect_fast_fail; }
timed docker exec "$sandbox" ping -c1 -W1 "$server4"; expect_fail
timed docker exec "$sandbox" sh -c 'busybox httpd -p 127.0.0.1:8080 && nc -z -w2 127.0.0.1 8080'; expect_ok

echo "== the sandbox cannot touch the rules, even as root"
run docker exec "$sandbox" iptables -F; expect_fail
run docker exec "$sandbox" iptables-legacy -F; expect_fail
run docker exec "$sandbox" ip6tables -F; expect_fail
run docker exec "$sandbox" ip link set lo down; expect_fail
run docker exec "$sandbox" sh -c 'grep Cap /proc/self/status'; expect_ok
timed docker exec "$sandbox" nc -z -w2 "$server4" 80; expect_fast_fail

echo "== remove rules (empty payload) and the connection works again"
run docker exec -i "$holder" iptables-restore <<<$'*filter\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n'; expect_ok
timed docker exec "$sandbox" nc -z -w2 "$server4" 80; expect_ok

echo "== stop timings"
run docker stop -t 10 "$sandbox"; expect_ok
run docker stop -t 10 "$holder"; expect_ok
echo "SMOKE OK"
