"""Inspect (`inspect_ai`) sandbox environment backed by a corral provider (extra `inspect`).

Importing this module registers the `corral` sandbox type with Inspect; Inspect also
imports it through its `inspect_ai` entry-point group, so `sandbox=("corral", config)`
works in an eval without an import.
"""

from corral.adapters.inspect.config import CorralSandboxConfig
from corral.adapters.inspect.sandbox import CorralSandboxEnvironment

__all__ = ["CorralSandboxConfig", "CorralSandboxEnvironment"]
