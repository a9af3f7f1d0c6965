"""Snapshots: a sandbox's files saved as a local image that forks start from.

The image keeps the sandbox's files and nothing else of the session. `docker commit` of the
sandbox container would keep too much: the image records the committing container's whole
config (`ContainerConfig`: the plan's env values, secrets included), and merges its env,
entrypoint and command into the new image's. So the sandbox's filesystem is exported
(paused, for a consistent copy) and imported as a flat image, and a container made from
that, which never ran and carries nothing of the plan, is committed with the source image's
own settings and corral's labels. A fork then runs only what its own plan says. The price:
a snapshot shares no layers with its source image.
"""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime
from typing import Any

import anyio
from docker.errors import APIError, ImageNotFound

from corral.core.labels import EXPIRES_AT, OWNER, SESSION, is_expired, new_session_id
from corral.core.snapshot import SnapshotRef
from corral.errors import ConfigError, ProviderError
from corral.providers.docker.engine import Engine, Raw
from corral.providers.docker.resources import ROLE, discard_container

SNAPSHOT = "corral.snapshot"
#: on the flat image a snapshot is committed from: removed with its snapshot, or by gc
#: once expired when the save never got that far
PART = "corral.snapshot-part"
REPOSITORY = "corral.local/snapshot"
#: pauses tried, 0.2 s apart, while the engine says the sandbox runs (`_pause`)
PAUSE_TRIES = 10


def image_config(source: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The snapshot image's config: the `source` image's own settings, and `labels`."""
    return {
        "Env": source.get("Env") or [],
        "Entrypoint": source.get("Entrypoint") or [],
        "Cmd": source.get("Cmd") or [],
        "WorkingDir": source.get("WorkingDir") or "",
        "User": source.get("User") or "",
        "Labels": labels,
    }


async def commit(
    engine: Engine, sandbox: str, owner: str, source_session: str, lifetime_s: float
) -> SnapshotRef:
    """Save the `sandbox` container's files as an image labelled as `owner`'s snapshot."""
    snapshot_id = new_session_id()
    created = time.time()
    expires = int(created + lifetime_s)
    labels = {
        OWNER: owner,
        SESSION: source_session,
        EXPIRES_AT: str(expires),
        SNAPSHOT: snapshot_id,
        ROLE: "snapshot",
    }
    part_labels = {**{k: v for k, v in labels.items() if k != SNAPSHOT}, PART: snapshot_id}
    flat: list[str] = []
    try:
        container: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, sandbox)
        source: dict[str, Any] = await engine.idempotent(
            engine.api.inspect_image, container["Image"]
        )
        # The worker thread is always waited for, also when the caller is cancelled: the
        # flat image it made is then in `flat`, never lost with the call's return value.
        await engine.call(_flatten, engine.api, sandbox, part_labels, flat)
        await _commit_blank(engine, flat[0], image_config(source["Config"] or {}, labels))
    except BaseException as exc:
        # Once committed it is the snapshot's parent, removed with it; until then, ours.
        with anyio.CancelScope(shield=True):
            for image in flat:
                await _remove_image(engine, image)
        if isinstance(exc, APIError):
            raise ProviderError(
                f"saving sandbox {source_session} failed: {exc.explanation}"
            ) from None
        raise
    return SnapshotRef(
        provider="docker",
        id=snapshot_id,
        created_at=datetime.fromtimestamp(created, UTC),
        source_session=source_session,
        expires_at=datetime.fromtimestamp(expires, UTC),
    )


async def _commit_blank(engine: Engine, flat: str, config: dict[str, Any]) -> None:
    """Commit a container of `flat` that never runs, so the image records only `config`."""
    labels: dict[str, str] = config["Labels"]
    blank = await engine.call(engine.api.create_container, flat, ["sh"], labels=labels)
    try:
        await engine.call(
            engine.api.commit,
            blank["Id"],
            repository=REPOSITORY,
            tag=labels[SNAPSHOT],
            conf=config,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await discard_container(engine, blank["Id"])


def _flatten(api: Raw, sandbox: str, labels: dict[str, str], made: list[str]) -> None:
    """The sandbox's filesystem, paused while it is read, as a new image labelled with
    `labels` (its id appended to `made`)."""
    changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in labels.items()]
    _pause(api, sandbox)
    try:
        answer: str = api.import_image_from_stream(api.export(sandbox), changes=changes)
    finally:
        api.unpause(sandbox)
    made.append(str(json.loads(answer.strip().splitlines()[-1])["status"]))


def _pause(api: Raw, sandbox: str) -> None:
    """Pause `sandbox`. Just after a restart (the end of a phase) runc may still call the
    running container stopped (seen under load, 0.2 s after the start): while the engine
    says it runs, the pause is tried again, for up to 2 s."""
    for attempt in range(PAUSE_TRIES):
        try:
            api.pause(sandbox)
            return
        except APIError as exc:
            running = api.inspect_container(sandbox)["State"].get("Running")
            if "stopped" not in str(exc.explanation) or not running or attempt == PAUSE_TRIES - 1:
                raise
        time.sleep(0.2)


async def _remove_image(engine: Engine, image: str) -> None:
    with contextlib.suppress(ImageNotFound):
        await engine.idempotent(engine.api.remove_image, image)


async def _images(engine: Engine, owner: str, ref: SnapshotRef) -> list[dict[str, Any]]:
    """`owner`'s images of snapshot `ref` (by its id and source session)."""
    images: list[dict[str, Any]] = await engine.idempotent(
        engine.api.images, filters={"label": [f"{OWNER}={owner}", f"{SNAPSHOT}={ref.id}"]}
    )
    wanted = {SNAPSHOT: ref.id, SESSION: ref.source_session}
    return [i for i in images if wanted.items() <= dict(i.get("Labels") or {}).items()]


async def find(engine: Engine, owner: str, ref: SnapshotRef) -> str:
    """The id of `owner`'s live image of snapshot `ref`; ConfigError naming it otherwise."""
    for image in await _images(engine, owner, ref):
        if is_expired(image.get("Labels") or {}, owner):
            raise ConfigError(f"snapshot {ref.id!r} expired at {ref.expires_at.isoformat()}")
        return str(image["Id"])
    raise ConfigError(
        f"snapshot {ref.id!r} of session {ref.source_session!r} is not on this engine for "
        f"owner {owner!r}"
    )


async def discard(engine: Engine, owner: str, ref: SnapshotRef) -> None:
    """Remove `owner`'s image of `ref` (its flat parent goes with it); one already gone is
    no error. A fork's container keeps its image in use: the engine refuses, and so do we."""
    for image in await _images(engine, owner, ref):
        try:
            await engine.idempotent(engine.api.remove_image, image["Id"])
        except ImageNotFound:
            continue
        except APIError as exc:
            if exc.status_code != 409:
                raise
            raise ProviderError(
                f"snapshot {ref.id!r} is still the image of a fork's container; close the "
                "fork first"
            ) from None


async def collect_expired(engine: Engine, owner: str, now: float) -> list[str]:
    """Remove `owner`'s snapshot images past their expiry (for `corral gc`); one a fork's
    container still uses stays until a later run."""
    images: list[dict[str, Any]] = []
    for kind in (SNAPSHOT, PART):
        images += await engine.idempotent(
            engine.api.images, filters={"label": [f"{OWNER}={owner}", kind]}
        )
    removed: list[str] = []
    for image in images:
        labels: dict[str, str] = image.get("Labels") or {}
        name = labels.get(SNAPSHOT) or labels.get(PART)
        if not name or not is_expired(labels, owner, now):
            continue
        try:
            await engine.idempotent(engine.api.remove_image, image["Id"])
        except ImageNotFound:
            continue
        except APIError as exc:
            if exc.status_code != 409:  # in use by a container
                raise
            continue
        removed.append(f"snapshot {name}" if SNAPSHOT in labels else f"snapshot part {name}")
    return removed
