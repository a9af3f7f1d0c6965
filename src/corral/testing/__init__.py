"""The provider conformance suite, shipped as part of corral (like inspect's self_check).

Fixtures come from `corral.testing.plugin` (loaded automatically through the `pytest11`
entry point); the tests live in `corral.testing.conformance`.
"""

from corral.testing.servers import serve_tcp, stop_server

__all__ = ["serve_tcp", "stop_server"]
