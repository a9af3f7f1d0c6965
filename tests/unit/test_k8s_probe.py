"""The k8s policy probe fails closed: a dialler that cannot connect at all never reads as
"refused" (the script runs here with `sh`, against a stub or this host's busybox)."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.policy import NetworkPolicy
from corral.network.resolve import Resolution
from corral.providers.k8s import enforcement, probe
from corral.providers.k8s.execution import Target
from corral.providers.k8s.probe import DIAL_SCRIPT, verdict


def _dial(bin_dir: Path, host: str, port: int, control: int) -> str:
    done = subprocess.run(
        ["sh", "-c", DIAL_SCRIPT, "sh", str(control), host, str(port)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dialler_that_cannot_connect_is_not_a_refusal(tmp_path: Path) -> None:
    stub = tmp_path / "busybox"
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    output = _dial(tmp_path, "127.0.0.1", 9, _free_port())
    assert output.strip() == "control-failed"
    with pytest.raises(ProviderError, match="positive control"):
        verdict(output, "corral-x")


@pytest.mark.parametrize("output", ["", "refused\nconnected", "sh: busybox: not found"])
def test_anything_but_a_verdict_raises(output: str) -> None:
    with pytest.raises(ProviderError, match="could not probe"):
        verdict(output, "corral-x")


@pytest.mark.skipif(shutil.which("busybox") is None, reason="this host has no busybox")
def test_the_script_with_a_real_busybox(tmp_path: Path) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None
    (tmp_path / "busybox").symlink_to(busybox)
    with socket.create_server(("127.0.0.1", 0)) as server:
        open_port = server.getsockname()[1]
        opened = _dial(tmp_path, "127.0.0.1", open_port, _free_port())
    closed = _dial(tmp_path, "127.0.0.1", _free_port(), _free_port())
    assert (verdict(opened, "p"), verdict(closed, "p")) == (True, False)


@pytest.mark.anyio
async def test_dialling_several_at_once_raises_a_failed_control_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One dial whose control fails fails the whole check with its own ProviderError (not
    an ExceptionGroup a caller catching ProviderError would miss)."""

    async def run(target: object, argv: list[str], stdin: bytes | None = None) -> str:
        return "control-failed" if argv[-2] == "10.0.0.2" else "connected"

    monkeypatch.setattr(probe, "run", run)
    target = cast(Target, SimpleNamespace(pod="p"))
    first, second = ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2")
    assert await probe.dial_each(target, [(first, 80)], "/d") == [True]
    with pytest.raises(ProviderError, match="positive control"):
        await probe.dial_each(target, [(first, 80), (second, 80)], "/d")


_IF_INET6_LO = "00000000000000000000000000000001 01 80 10 80       lo\n"
_IF_INET6_ETH0 = "fe80000000000000a8f1c2fffe0a0b0c 02 40 20 80     eth0\n"
_ARP = (
    "IP address       HW type     Flags       HW address            Mask     Device\n"
    "10.88.0.1        0x1         0x2         52:54:00:12:34:56     *        eth0\n"
    "10.88.0.9        0x1         0x0         00:00:00:00:00:00     *        eth0\n"
)
_NODE = ipaddress.ip_address("192.168.1.5")


def test_ipv6_off_in_the_pod_needs_no_ipv6_dial() -> None:
    """IPV6_STATE's output as a Pod with IPv6 off gives it: no line before the `--`."""
    assert probe.ipv6_plan(f"--\n{_ARP}", [_NODE], 10250, "p") == []
    assert probe.ipv6_plan(f"{_IF_INET6_LO}--\n{_ARP}", [_NODE], 10250, "p") == []


def test_a_cut_ipv6_state_fails_closed() -> None:
    with pytest.raises(ProviderError, match="IPv6 state is cut"):
        probe.ipv6_plan(_IF_INET6_ETH0 + _ARP, [_NODE], 10250, "p")


def test_ipv6_on_dials_the_gateways_link_local_address_and_the_nodes_ipv6() -> None:
    """What an agent derives from the gateway's MAC (EUI-64), on the Pod's link."""
    node6 = ipaddress.ip_address("2001:db8::5")
    state = f"{_IF_INET6_LO}{_IF_INET6_ETH0}--\n{_ARP}"
    assert probe.ipv6_plan(state, [_NODE, node6], 10250, "p") == [
        (ipaddress.ip_address("fe80::5054:ff:fe12:3456%eth0"), 10250),
        (node6, 10250),
    ]


def test_ipv6_on_with_nothing_to_dial_fails_closed() -> None:
    header = _ARP.splitlines()[0]
    with pytest.raises(NetworkPolicyNotEnforced, match="IPv6 is on in Pod p .links eth0"):
        probe.ipv6_plan(f"{_IF_INET6_ETH0}--\n{header}\n", [_NODE], 10250, "p")


@pytest.mark.anyio
@pytest.mark.parametrize("links", [_IF_INET6_LO, _IF_INET6_LO + _IF_INET6_ETH0])
async def test_a_policy_that_leaks_only_over_ipv6_is_not_enforced(
    monkeypatch: pytest.MonkeyPatch, links: str
) -> None:
    """IPv4 refused, the gateway's link-local address answering: reported, never verified."""
    dialled: list[str] = []

    async def run(target: object, argv: list[str], stdin: bytes | None = None) -> str:
        assert argv[-1] == probe.IPV6_STATE
        return f"{links}--\n{_ARP}"

    async def dial(target: object, host: str, port: int, dialler: str | None = None) -> bool:
        dialled.append(host)
        return ":" in host

    monkeypatch.setattr(probe, "run", run)
    monkeypatch.setattr(probe, "dial", dial)
    target = cast(Target, SimpleNamespace(pod="p"))
    policy = NetworkPolicy.no_network()

    async def verify() -> float:
        candidates = [(_NODE, 10250)]
        return await enforcement.verify(target, policy, Resolution(), candidates, 0.1, dialler="/d")

    if links == _IF_INET6_LO:
        await verify()
        assert dialled == ["192.168.1.5"]
        return
    with pytest.raises(NetworkPolicyNotEnforced, match="fe80::5054:ff:fe12:3456%eth0:10250.*IPv6"):
        await verify()
