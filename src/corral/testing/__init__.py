"""The provider conformance suite, shipped as part of corral (like inspect's self_check).

Fixtures come from `corral.testing.plugin` (loaded automatically through the `pytest11`
entry point); the tests live in `corral.testing.conformance`.
"""

from corral.testing.plugin import EgressTarget, serve_tcp

__all__ = ["EgressTarget", "serve_tcp"]
