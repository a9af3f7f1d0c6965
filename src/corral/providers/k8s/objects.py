"""The API objects of one owner's sandboxes in one namespace: Pods and NetworkPolicies.

Each is created stamped with a token of the open that made it (`INSTANCE`), read by its
exact name, and deleted only if it carries the session's label and that token, by a
delete that holds only for the uid read. The environment, its warm pool and `gc` all go
through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.client.exceptions import ApiException

from corral.core.labels import OWNER, SESSION
from corral.errors import ProviderError, SessionIdTaken
from corral.providers.k8s.api import Api, call, explain, idempotent, status_of
from corral.providers.k8s.pod import INSTANCE

Kind = Literal["pod", "network_policy"]
#: the uid of each object one open created, from the create's own answer
Made = MutableMapping[Kind, str]


def labels_of(found: Any) -> dict[str, str]:
    return dict(found.metadata.labels or {})


def annotations_of(found: Any) -> dict[str, str]:
    return dict(found.metadata.annotations or {})


@dataclass(frozen=True)
class Objects:
    """`owner`'s Pods and NetworkPolicies in `namespace`, through `clients`."""

    clients: Api
    namespace: str
    owner: str

    def _api(self, kind: Kind) -> Any:
        return self.clients.core if kind == "pod" else self.clients.networking

    async def create(
        self,
        kind: Kind,
        body: dict[str, Any],
        instance: str,
        session_id: str | None,
        made: Made | None = None,
    ) -> Any:
        """Create one object stamped with the open's token `instance` (its uid into `made`);
        a caller's id that another open took first (409) is `SessionIdTaken`."""
        name: str = body["metadata"]["name"]
        body["metadata"].setdefault("annotations", {})[INSTANCE] = instance
        create = getattr(self._api(kind), f"create_namespaced_{kind}")
        try:
            created = await call(self.clients.tokens, create, self.namespace, body)
        except ApiException as exc:
            if status_of(exc) == 409 and session_id is not None:
                raise SessionIdTaken(
                    f"{kind} {name} already exists: session_id {session_id!r} is taken"
                ) from None
            raise ProviderError(f"the API server rejected {kind} {name}: {explain(exc)}") from None
        if made is not None:
            made[kind] = created.metadata.uid
        return created

    async def read(self, kind: Kind, name: str, session_id: str | None = None) -> Any | None:
        """The object `name` of `kind`, or None if absent (or, given `session_id`, if it is
        not that session's of this owner)."""
        read = getattr(self._api(kind), f"read_namespaced_{kind}")
        try:
            found: Any = await idempotent(self.clients.tokens, read, name, self.namespace)
        except ApiException as exc:
            if status_of(exc) == 404:
                return None
            raise ProviderError(f"reading {kind} {name}: {explain(exc)}") from None
        labels = labels_of(found)
        if session_id is not None and (
            labels.get(OWNER) != self.owner or labels.get(SESSION) != session_id
        ):
            return None
        return found

    async def delete(
        self,
        kind: Kind,
        name: str,
        session_id: str,
        instance: str | None,
        made: Made | None = None,
    ) -> None:
        """Delete one object by exact name, only if it carries this session's label and the
        token of the open that made it (`instance`; None for objects listed by gc); the
        delete holds only for the uid that was checked. What this open created (its uid in
        `made`) needs no read: that uid names exactly it, which halves a close's calls."""
        uid = (made or {}).get(kind)
        if uid is None:
            found = await self.read(kind, name)
            if found is None:
                return
            if labels_of(found).get(SESSION) != session_id:
                raise ProviderError(f"{kind} {name} is not session {session_id}'s; left alone")
            if instance is not None and annotations_of(found).get(INSTANCE) != instance:
                return  # another open of the same id made it; it is that open's to remove
            uid = found.metadata.uid
        delete = getattr(self._api(kind), f"delete_namespaced_{kind}")
        body = {"preconditions": {"uid": uid}, "gracePeriodSeconds": 0}
        with contextlib.suppress(ApiException):
            await idempotent(self.clients.tokens, delete, name, self.namespace, body=body)

    async def patch_pod(self, pod: str, metadata: dict[str, Any]) -> Any:
        """Merge `metadata` (labels, annotations) into the Pod's; the Pod as it is now."""
        return await idempotent(
            self.clients.tokens,
            self.clients.core.patch_namespaced_pod,
            pod,
            self.namespace,
            {"metadata": metadata},
        )

    async def own(self, pod: str, uid: str, policy: str) -> None:
        """Make the Pod the NetworkPolicy's owner, for the garbage collector."""
        owner = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}
        try:
            await idempotent(
                self.clients.tokens,
                self.clients.networking.patch_namespaced_network_policy,
                policy,
                self.namespace,
                {"metadata": {"ownerReferences": [owner]}},
            )
        except ApiException as exc:
            raise ProviderError(
                f"making Pod {pod} own NetworkPolicy {policy}: {explain(exc)}"
            ) from None

    async def listed(self, kind: Kind, selector: str) -> list[Any]:
        """The objects of `kind` whose labels match `selector`."""
        try:
            found: Any = await idempotent(
                self.clients.tokens,
                getattr(self._api(kind), f"list_namespaced_{kind}"),
                self.namespace,
                label_selector=selector,
            )
        except ApiException as exc:
            # A refusal (no such namespace, no right to list in it) in one line that names
            # the namespace: `corral gc` and Inspect's cleanup say it and go on.
            raise ProviderError(
                f"listing {kind.replace('_', ' ')}s in namespace {self.namespace!r} was "
                f"refused: {status_of(exc)} {explain(exc)}"
            ) from None
        return list(found.items)
