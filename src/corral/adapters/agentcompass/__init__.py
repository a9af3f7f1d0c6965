"""corral's providers as AgentCompass environments (extra `agentcompass`, Python >= 3.12).

Importing this module registers `corral-docker` and `corral-k8s` (where their SDKs are
installed) in AgentCompass's environment registry, so a run can pick them by id.
Without AgentCompass installed it imports cleanly and registers nothing (`REGISTERED`
is empty and `UNAVAILABLE` says why).
"""

from corral.adapters.agentcompass.contract import load
from corral.adapters.agentcompass.registration import register


def _register() -> tuple[list[str], str | None]:
    try:
        contract = load()
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("agentcompass"):
            raise
        return [], f"AgentCompass is not installed ({exc}); it needs Python >= 3.12"
    return register(contract), None


REGISTERED, UNAVAILABLE = _register()

__all__ = ["REGISTERED", "UNAVAILABLE"]
