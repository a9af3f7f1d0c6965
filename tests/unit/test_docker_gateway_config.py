"""Which sandboxes get a gateway, and gVisor's `/tmp` volume (no engine needed)."""

from __future__ import annotations

import pytest

from corral.providers.docker import DockerConfig
from corral.providers.docker.own_kernel import own_tmp


@pytest.mark.parametrize(
    ("runtime", "gateway", "routed"),
    [
        (None, None, False),
        ("runc", None, False),
        ("runsc", None, True),
        ("kata", None, True),
        ("runsc", False, False),
        (None, True, True),
    ],
)
def test_a_gateway_for_every_runtime_but_runc_unless_told(
    runtime: str | None, gateway: bool | None, routed: bool
) -> None:
    assert DockerConfig(runtime=runtime, gateway=gateway).routed is routed


def test_gvisor_gets_a_labelled_tmp_volume_unless_the_config_mounts_tmp() -> None:
    labels = {"corral.owner": "o", "corral.session": "s"}
    (mount,) = own_tmp("runsc", labels, ["/srv/data:/data:ro"]) or []
    assert (mount["Target"], mount["Type"], mount["VolumeOptions"]["Labels"]) == (
        "/tmp",
        "volume",
        labels,
    )
    assert own_tmp("runsc", labels, ["scratch:/tmp"]) is None
    assert own_tmp("runc", labels, []) is None
    assert own_tmp(None, labels, []) is None
