"""The adapters run against the Docker integration tests' engine, images and owner label."""

from tests.integration.docker.conftest import engine as engine
from tests.integration.docker.conftest import owner as owner
