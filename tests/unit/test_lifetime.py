"""Sandboxes end at their lifetime by themselves: the Docker timer and the Pod deadline."""

from __future__ import annotations

import subprocess
import time

from corral import ExecutionPlan, Timeouts
from corral.providers.docker.environment import sleep_until
from corral.providers.k8s import KubernetesConfig
from corral.providers.k8s.pod import manifest


def test_the_docker_timer_sleeps_until_the_deadline_at_every_start() -> None:
    started = time.monotonic()
    subprocess.run(sleep_until(str(int(time.time()) + 2)), check=True, timeout=5)
    assert 1 <= time.monotonic() - started <= 3
    # Started again past the deadline (a restart late in life), it ends at once.
    started = time.monotonic()
    subprocess.run(sleep_until(str(int(time.time()) - 5)), check=False, timeout=5)
    assert time.monotonic() - started < 1


def test_every_pod_has_a_deadline() -> None:
    cfg = KubernetesConfig(default_lifetime_s=90.5)
    default = manifest("n", "img", ExecutionPlan(image="img"), cfg, {}, ())
    assert default["spec"]["activeDeadlineSeconds"] == 91
    short = ExecutionPlan(image="img", timeouts=Timeouts(max_lifetime_s=8))
    assert manifest("n", "img", short, cfg, {}, ())["spec"]["activeDeadlineSeconds"] == 8
