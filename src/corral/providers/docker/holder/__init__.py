"""The holder image: its Dockerfile ships in this package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, BuildError, DockerException

from corral.errors import ProviderError

DOCKERFILE_DIR = Path(__file__).parent


def build_holder_image(tag: str, base: str) -> str:
    """Build the holder from the packaged Dockerfile (needs a registry for `base`)."""
    try:
        client: Any = docker.from_env()
        image, _ = client.images.build(
            path=str(DOCKERFILE_DIR), tag=tag, buildargs={"BASE": base}, rm=True
        )
    except (APIError, BuildError, DockerException) as exc:
        raise ProviderError(f"building the holder image {tag!r} failed: {exc}") from None
    return str(image.id)
