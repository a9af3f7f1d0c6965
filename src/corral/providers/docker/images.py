"""The images a `docker` session starts from: the plan's (a name, an image id, or a build
context), the holder's and the services', present on the engine as `pull_policy` says."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from docker.errors import APIError, DockerException, ImageNotFound

from corral.core.labels import OWNER
from corral.core.plan import ExecutionPlan
from corral.errors import ConfigError
from corral.providers.docker.config import DockerConfig
from corral.providers.docker.engine import Engine


async def for_plan(engine: Engine, plan: ExecutionPlan, config: DockerConfig, env_id: str) -> str:
    """The image the plan's sandbox starts from (for environment `env_id`), on the engine."""
    chosen = plan.require_image(env_id)
    if isinstance(chosen, str):
        await ensure(engine, chosen, config)
        return chosen
    return await _native(engine, chosen, config.owner)


async def ensure(engine: Engine, image: str, config: DockerConfig) -> None:
    """`image` on the engine: looked up, and pulled unless `pull_policy` is "never"."""
    policy = config.pull_policy
    if policy != "always":
        try:
            await engine.idempotent(engine.api.inspect_image, image)
            return
        except ImageNotFound:
            if policy == "never":
                raise ConfigError(
                    f"image {image!r} is not on the engine and pull_policy is 'never'"
                ) from None
    auth = None
    if config.registry_username and config.registry_password:
        auth = {
            "username": config.registry_username,
            "password": config.registry_password.get_secret_value(),
        }
    try:
        await engine.call(engine.client.images.pull, image, auth_config=auth)
    except (APIError, DockerException) as exc:
        reason = getattr(exc, "explanation", None) or type(exc).__name__
        raise ConfigError(f"image {image!r} is not available: {reason}") from None


async def _native(engine: Engine, native: dict[str, Any], owner: str) -> str:
    """A native selector's image: an image id, or one built from a context (labelled)."""
    if set(native) == {"image_id"}:
        try:
            await engine.idempotent(engine.api.inspect_image, native["image_id"])
        except ImageNotFound:
            raise ConfigError(f"native image_id {native['image_id']!r} not found") from None
        return str(native["image_id"])
    if "build_context" in native and set(native) <= {"build_context", "dockerfile"}:
        key = hashlib.sha256(json.dumps(native, sort_keys=True).encode()).hexdigest()[:16]
        tag = f"corral-build:{key}"
        try:
            await engine.call(
                engine.client.images.build,
                path=str(native["build_context"]),
                dockerfile=native.get("dockerfile"),
                tag=tag,
                labels={OWNER: owner},
                rm=True,
            )
        except (APIError, DockerException, TypeError) as exc:
            raise ConfigError(f"building native {native!r} failed: {exc}") from None
        return tag
    raise ConfigError(
        f"native selector {native!r} is not understood by docker; use "
        "{'image_id': ...} or {'build_context': path, 'dockerfile': optional}"
    )
