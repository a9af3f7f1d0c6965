"""Inspect's own sandbox suite (`inspect_ai.util._sandbox.self_check`) against corral.

Runs on a real Docker Engine, as root and as a non-root user; never against `local` or
anything that executes on the test host as root: the suite adds and deletes users.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]

from corral.adapters.inspect import CorralSandboxEnvironment
from tests.integration.adapters.inspect_configs import (
    DOCKER_NONROOT,
    DOCKER_ROOT,
    K8S_ROOT,
    SuiteTarget,
)

pytestmark = pytest.mark.anyio

TARGETS = [
    pytest.param(DOCKER_ROOT, id=DOCKER_ROOT.id, marks=pytest.mark.docker),
    pytest.param(DOCKER_NONROOT, id=DOCKER_NONROOT.id, marks=pytest.mark.docker),
    pytest.param(K8S_ROOT, id=K8S_ROOT.id, marks=pytest.mark.k8s),
]


class Opened(NamedTuple):
    target: SuiteTarget
    env: SandboxEnvironment


@pytest.fixture(scope="module", params=TARGETS)
async def _opened(request: pytest.FixtureRequest, engine: Any, owner: str) -> AsyncIterator[Opened]:
    # One sandbox per target, shared by its checks (as Inspect's own runner does).
    target: SuiteTarget = request.param
    task = f"self-check-{target.id}"
    config = target.config(owner)
    await CorralSandboxEnvironment.task_init(task, config)
    envs = await CorralSandboxEnvironment.sample_init(task, config, {})
    try:
        yield Opened(target, envs["default"])
    finally:
        await CorralSandboxEnvironment.sample_cleanup(task, config, envs, False)
        await CorralSandboxEnvironment.task_cleanup(task, config, True)


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, _opened: Opened) -> SandboxEnvironment:
    check: str = request.node.originalname  # pyright: ignore[reportAttributeAccessIssue]
    reason = _opened.target.xfails.get(check)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return _opened.env
