"""An egress test target: a TCP server that answers `ok` and a UDP echo, on one address.

Run by compose.yaml's target services (python3 from the test image, no dependencies):
    python3 targets.py ADDRESS [TCP_PORT] [UDP_PORT]
"""

from __future__ import annotations

import socket
import sys
import threading


def serve_tcp(address: str, port: int) -> None:
    server = socket.create_server((address, port), reuse_port=True)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"ok\n")


def serve_udp(address: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    while True:
        data, peer = sock.recvfrom(2048)
        sock.sendto(b"echo:" + data, peer)


def main() -> None:
    address = sys.argv[1]
    tcp_port = int(sys.argv[2]) if len(sys.argv) > 2 else 8080
    udp_port = int(sys.argv[3]) if len(sys.argv) > 3 else 8081
    threading.Thread(target=serve_udp, args=(address, udp_port), daemon=True).start()
    print(f"target on {address}: tcp {tcp_port}, udp {udp_port}", flush=True)
    serve_tcp(address, tcp_port)


if __name__ == "__main__":
    main()
