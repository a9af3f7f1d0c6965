"""An agent's key kept out of the sandbox, for the adapters whose harness hands commands an
env (Harbor, Inspect): the key's variable withheld from every command, and a variable set
to a credential route's URL instead (`ExecutionPlan.credentials`, `corral.core.credentials`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, Field

from corral.core.credentials import route_env_name
from corral.core.session import EnvironmentSession

#: what a withheld variable reads in the sandbox: a key's place, holding no key (SDKs that
#: insist on one still start, and the route's proxy adds the real one)
WITHHELD = "corral-credential-route"


class RoutedEnv(BaseModel):
    """Which command env variables are credential routes' URLs, and which are withheld."""

    credential_env: dict[str, str] = Field(
        default={},
        description="env variable -> credential route name: in every command the variable "
        "is the route's URL, whatever the harness gave (e.g. OPENAI_BASE_URL: model)",
    )
    withhold_env: tuple[str, ...] = Field(
        default=(),
        description="env variables the harness would hand the sandbox (the agent's API keys) "
        f"that never reach it: replaced by {WITHHELD!r} in every command's env",
    )

    def check_routes(self, routes: Iterable[str]) -> None:
        """A ValueError naming each `credential_env` route that `routes` does not define."""
        defined = set(routes)
        for variable, route in self.credential_env.items():
            if route not in defined:
                raise ValueError(
                    f"credential_env {variable!r} names route {route!r}, which credentials "
                    f"does not define (routes: {', '.join(sorted(defined)) or 'none'})"
                )

    def withheld(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        """`env` with the withheld variables' values replaced."""
        if env is None:
            return None
        return {k: WITHHELD if k in self.withhold_env else v for k, v in env.items()}

    def routed(
        self, env: Mapping[str, str] | None, urls: Mapping[str, str]
    ) -> dict[str, str] | None:
        """`env` withheld (`withheld`) and the routed variables set to their route's URL
        (`urls`: route name -> URL, `route_urls`)."""
        given = self.withheld(env)
        if not self.credential_env:
            return given
        return {**(given or {}), **{k: urls[r] for k, r in self.credential_env.items()}}

    def route_urls(self, session: EnvironmentSession) -> dict[str, str]:
        """The URL of each route `credential_env` names, as corral gave it to `session`
        (from corral's side: never read back from inside the sandbox)."""
        urls: dict[str, str] = {}
        for route in sorted(set(self.credential_env.values())):
            url = session.credential_env.get(route_env_name(route))
            if not url:
                raise ValueError(
                    f"sandbox {session.id} has no URL for credential route {route!r} "
                    "(credential routes need a provider with supports_credentials)"
                )
            urls[route] = url
        return urls
