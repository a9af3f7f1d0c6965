#!/usr/bin/env bash
# Bring up a single-node Kubernetes cluster on this machine, from binaries built from
# upstream sources (build.sh) and Debian packages:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (its own
#   socket, root and state), kubelet (cgroupfs), CNI bridge + host-local + portmap,
#   kube-router as the NetworkPolicy enforcer.
# Every pid is recorded in $CLUSTER_RUN/pids; down.sh stops them and removes the rest.
# Prints `export KUBECONFIG=...` on success.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

START=$(date +%s)
[ "$(id -u)" = 0 ] || die "must run as root"

# ------------------------------------------------------------------ packages
DEBIAN_PACKAGES=(containerd runc containernetworking-plugins ipset iptables conntrack
    busybox-static openssl curl gcc libc6-dev python3 iproute2 util-linux)
install_packages() {
    local missing=() p
    for p in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends "${missing[@]}" \
        || { apt-get -o DPkg::Lock::Timeout=900 update \
            && apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends \
                "${missing[@]}"; }
}

# ------------------------------------------------------------------ helpers
start_proc() { # name cmd...
    local name="$1"; shift
    log "starting $name"
    setsid "$@" </dev/null >"$CLUSTER_LOGS/$name.log" 2>&1 &
    echo $! >"$PID_DIR/$name.pid"
}

wait_for() { # description timeout-seconds command...
    local what="$1" timeout="$2"; shift 2
    local deadline=$(( $(date +%s) + timeout ))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            log "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.5
    done
    log "$what: ok"
}

check_alive() {
    local f name
    for f in "$PID_DIR"/*.pid; do
        name="$(basename "$f" .pid)"
        kill -0 "$(cat "$f")" 2>/dev/null || {
            log "$name exited; last lines of $CLUSTER_LOGS/$name.log:"
            tail -n 30 "$CLUSTER_LOGS/$name.log" >&2 || true
            return 1
        }
    done
}

on_error() {
    local rc=$?
    log "bring-up failed (exit $rc); logs in $CLUSTER_LOGS; run down.sh to clean up"
    check_alive || true
    exit "$rc"
}

kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

node_ip() {
    local ip
    ip="$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
    [ -n "$ip" ] || ip="$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n1)"
    [ -n "$ip" ] || die "cannot find this machine's IPv4 address"
    echo "$ip"
}

# ------------------------------------------------------------------ certificates
PKI="$CLUSTER_STATE/pki"
make_cert() { # name CN O(or -) sans(or -) [server]
    local name="$1" cn="$2" org="$3" sans="$4" subj="/CN=$2"
    [ "$org" = - ] || subj="/O=$org/CN=$cn"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [ "$sans" = - ]; then
            echo "extendedKeyUsage=clientAuth"
        else
            echo "extendedKeyUsage=serverAuth,clientAuth"
            echo "subjectAltName=$sans"
        fi
    } >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 3650 -sha256 -extfile "$PKI/$name.ext" \
        -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_kubeconfig() { # file user cert-name
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: corral
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$3.crt
    client-key: $PKI/$3.key
contexts:
- name: corral
  context: {cluster: corral, user: $2}
current-context: corral
EOF
    chmod 600 "$1"
}

make_pki() {
    mkdir -p "$PKI"; chmod 700 "$PKI"
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI/ca.key" -subj "/CN=corral-cluster-ca" -days 3650 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "$PKI/ca.crt" 2>/dev/null
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
    local api_sans="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    api_sans="$api_sans,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
    api_sans="$api_sans,IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP"
    make_cert apiserver kube-apiserver - "$api_sans"
    make_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters -
    make_cert admin corral-admin system:masters -
    make_cert controller-manager system:kube-controller-manager - -
    make_cert scheduler system:kube-scheduler - -
    make_cert kubelet-client "system:node:$NODE_NAME" system:nodes -
    make_cert kubelet-server "system:node:$NODE_NAME" system:nodes \
        "DNS:$NODE_NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1"
    make_kubeconfig "$ADMIN_KUBECONFIG" corral-admin admin
    make_kubeconfig "$CLUSTER_STATE/controller-manager.kubeconfig" controller-manager controller-manager
    make_kubeconfig "$CLUSTER_STATE/scheduler.kubeconfig" scheduler scheduler
    make_kubeconfig "$CLUSTER_STATE/kubelet.kubeconfig" kubelet kubelet-client
}

# ------------------------------------------------------------------ config files
write_containerd_config() {
    mkdir -p "$CLUSTER_STATE/containerd" "$CLUSTER_RUN/containerd"
    cat >"$CLUSTER_STATE/runsc.toml" <<EOF
binary_name = "$GVISOR_BIN/runsc"
root = "$CLUSTER_RUN/runsc"
[runsc_config]
  platform = "systrap"
EOF
    cat >"$CLUSTER_STATE/containerd.toml" <<EOF
version = 2
root = "$CLUSTER_STATE/containerd"
state = "$CLUSTER_RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CLUSTER_RUN/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$CLUSTER_STATE/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # This machine refuses negative oom_score_adj values (even for root); kubelet asks -998
  # for sandboxes, which makes runc fail with "can't get final child's PID from pipe".
  # Clamp to containerd's own score instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CLUSTER_RUN/runc"
    # gVisor (RuntimeClass gvisor): its own network stack inside each Pod, whose packets
    # still leave through the Pod's veth, where the CNI's NetworkPolicy rules see them.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$CLUSTER_STATE/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1
EOF
}

write_cni_config() {
    mkdir -p "$CNI_CONF_DIR" "$CLUSTER_STATE/cni/ipam"
    cat >"$CNI_CONF_DIR/10-corral.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "corral",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CLUSTER_STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kubelet_config() {
    mkdir -p "$CLUSTER_STATE/kubelet" "$CLUSTER_STATE/pod-logs"
    cat >"$CLUSTER_STATE/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-server.crt
tlsPrivateKeyFile: $PKI/kubelet-server.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $CLUSTER_STATE/pod-logs
serializeImagePulls: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "2%"
  nodefs.inodesFree: "2%"
  imagefs.available: "2%"
imageGCHighThresholdPercent: 98
imageGCLowThresholdPercent: 95
maxPods: 110
# kube-router polices IPv4 only: corral turns IPv6 off in each sandbox Pod with these.
allowedUnsafeSysctls: ["net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"]
rotateCertificates: false
serverTLSBootstrap: false
EOF
}

# ------------------------------------------------------------------ main
trap on_error ERR

if [ -d "$CLUSTER_RUN" ] || [ -d "$CLUSTER_STATE" ]; then
    log "found state of an earlier cluster: running down.sh first"
    bash "$HERE/down.sh"
fi

install_packages
[ -x "$K8S_BIN/kubelet" ] && [ -f "$K8S_BIN/../.complete" ] \
    && [ -f "$ETCD_BIN/../.complete" ] && [ -f "$KUBE_ROUTER_BIN/../.complete" ] \
    && [ -f "$GVISOR_BIN/../.complete" ] && [ -f "$IMAGES_DIR/.complete" ] \
    || { log "binary cache is cold: running build.sh (this takes a long while)"; \
         bash "$HERE/build.sh"; }

NODE_IP="$(node_ip)"
mkdir -p "$CLUSTER_STATE" "$CLUSTER_RUN" "$PID_DIR" "$CLUSTER_LOGS"
chmod 700 "$CLUSTER_STATE"
# Remember what existed before, so down.sh removes only what this cluster created.
[ -e /var/log/containers ] || touch "$CLUSTER_RUN/created-var-log-containers"

log "node $NODE_NAME at $NODE_IP, pods $POD_CIDR (cluster $CLUSTER_CIDR), services $SERVICE_CIDR"
make_pki
write_containerd_config
write_cni_config
write_kubelet_config

# Kernel settings the bridge CNI and NetworkPolicy enforcement need (Docker sets the
# same ones; they are left as they are on down).
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null \
    || log "warning: net.bridge.bridge-nf-call-iptables unavailable (br_netfilter missing?)"

# etcd
start_proc etcd "$ETCD_BIN/etcd" --name corral --data-dir "$CLUSTER_STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "corral=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn

# containerd starts in parallel with the control plane.
# containerd finds a runtime's shim on its PATH (containerd-shim-runsc-v1).
start_proc containerd env PATH="$GVISOR_BIN:$PATH" \
    containerd --config "$CLUSTER_STATE/containerd.toml"

wait_for etcd 60 curl -sf "http://127.0.0.1:$ETCD_CLIENT_PORT/health"

start_proc kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-address "$NODE_IP" --secure-port "$APISERVER_PORT" \
    --cert-dir "$CLUSTER_STATE/apiserver" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --v=1

wait_for containerd 60 ctr --address "$CONTAINERD_SOCK" version
log "importing images"
ctr_ images import "$IMAGES_DIR/pause.tar" >/dev/null
ctr_ images import "$IMAGES_DIR/test.tar" >/dev/null

wait_for kube-apiserver 120 kubectl_ get --raw /readyz

start_proc kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$CLUSTER_STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --allocate-node-cidrs=true --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 24 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --v=1
start_proc kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig "$CLUSTER_STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --v=1
start_proc kubelet "$K8S_BIN/kubelet" \
    --config "$CLUSTER_STATE/kubelet-config.yaml" \
    --kubeconfig "$CLUSTER_STATE/kubelet.kubeconfig" \
    --root-dir "$CLUSTER_STATE/kubelet" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1

wait_for "node $NODE_NAME registered" 90 kubectl_ get node "$NODE_NAME"
wait_for "podCIDR allocated" 60 \
    bash -c "[ -n \"\$(\"$K8S_BIN/kubectl\" --kubeconfig \"$ADMIN_KUBECONFIG\" get node \
        \"$NODE_NAME\" -o jsonpath='{.spec.podCIDR}')\" ]"
allocated="$(kubectl_ get node "$NODE_NAME" -o jsonpath='{.spec.podCIDR}')"
[ "$allocated" = "$POD_CIDR" ] \
    || die "controller-manager gave the node $allocated, but CNI is configured for $POD_CIDR"

# kube-router: NetworkPolicy enforcement only (no routing, no service proxy).
start_proc kube-router "$KUBE_ROUTER_BIN/kube-router" \
    --kubeconfig "$ADMIN_KUBECONFIG" --hostname-override "$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false \
    --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    --metrics-port 0 --v=1

wait_for "node Ready" 120 kubectl_ wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s
wait_for "default service account" 60 kubectl_ -n default get serviceaccount default
kubectl_ apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
EOF
wait_for "kube-router healthy" 60 curl -sf http://127.0.0.1:20244/healthz
check_alive

trap - ERR
log "cluster up in $(( $(date +%s) - START ))s; logs in $CLUSTER_LOGS"
echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
