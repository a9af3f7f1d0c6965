"""The conformance suite against the embedded `local` provider."""

from __future__ import annotations

import pytest

from corral import ENVIRONMENTS, BaseEnvironment, ExecutionPlan
from corral.testing.conformance import *  # noqa: F403
from corral.testing.processes import *  # noqa: F403


@pytest.fixture
def corral_environment() -> BaseEnvironment:
    return ENVIRONMENTS.create("local")


@pytest.fixture
def corral_plan() -> ExecutionPlan:
    return ExecutionPlan()
