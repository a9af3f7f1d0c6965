"""`corral gc` and a NetworkPolicy whose open died before its Pod owned it: given to that
Pod (so it goes with it), or removed once its Pod cannot come any more."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from corral.core.labels import OWNER, SESSION, session_labels
from corral.providers.k8s.environment import ORPHAN_GRACE_S, orphans
from corral.providers.k8s.objects import Objects
from corral.providers.k8s.pod import INSTANCE

pytestmark = pytest.mark.anyio


def _object(name: str, age_s: float, instance: str, owned: bool = False) -> Any:
    created = datetime.datetime.fromtimestamp(time.time() - age_s, datetime.UTC)
    return SimpleNamespace(
        metadata=SimpleNamespace(
            name=name,
            uid=f"uid-{name}",
            labels=session_labels("me", name.removeprefix("corral-"), 3600, {}),
            annotations={INSTANCE: instance},
            owner_references=[{"kind": "Pod"}] if owned else None,
            creation_timestamp=created,
        )
    )


@dataclass
class _Objects:
    """The API as gc sees it: policies listed, Pods read; what gc did, recorded."""

    policies: list[Any]
    pods: dict[str, Any]
    owner: str = "me"
    done: list[tuple[str, ...]] = field(default_factory=list[tuple[str, ...]])

    async def listed(self, kind: str, selector: str) -> list[Any]:
        assert (kind, selector) == ("network_policy", f"{OWNER}=me")
        return self.policies

    async def read(self, kind: str, name: str, session_id: str | None = None) -> Any:
        pod = self.pods.get(name)
        return pod if pod is not None and pod.metadata.labels[SESSION] == session_id else None

    async def own(self, pod: str, uid: str, policy: str) -> None:
        self.done.append(("own", policy, uid))

    async def delete(self, kind: str, name: str, session_id: str, instance: str | None) -> None:
        self.done.append(("delete", name, session_id, str(instance)))


async def test_a_policy_its_open_never_owned_goes_with_its_pod_or_alone() -> None:
    fake = _Objects(
        policies=[
            _object("corral-owned", 999, "a", owned=True),
            _object("corral-adopt", 1, "b"),  # killed between the Pod's create and own()
            _object("corral-young", 1, "c"),  # an open about to create its Pod
            _object("corral-gone", ORPHAN_GRACE_S + 1, "d"),  # its Pod never came, or went
            _object("corral-other", ORPHAN_GRACE_S + 1, "e"),  # selects another open's Pod
        ],
        pods={
            "corral-adopt": _object("corral-adopt", 1, "b"),
            "corral-other": _object("corral-other", 1, "someone else's"),
        },
    )
    removed = await orphans(cast(Objects, fake), time.time())
    assert fake.done == [
        ("own", "corral-adopt", "uid-corral-adopt"),
        ("delete", "corral-gone", "gone", "d"),
    ]
    assert removed == ["networkpolicy corral-gone"]
