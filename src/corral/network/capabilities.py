"""What a provider can enforce, and the fail-closed check of a schedule against it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from corral.errors import NetworkPolicyUnsupported
from corral.network.policy import NetworkMode, NetworkPolicy, NetworkSchedule, Phase
from corral.network.targets import EntryType

_WHY = {
    EntryType.WILDCARD_HOSTNAME: (
        ": a wildcard is enforced by watching the names the sandbox resolves, and a "
        "denylist leaves it free to use any resolver"
    )
}


class NetworkCapabilities(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str
    modes: frozenset[NetworkMode]
    entry_types: frozenset[EntryType] = frozenset()
    #: entry types a denylist may use; None: the same as `entry_types`
    denylist_entry_types: frozenset[EntryType] | None = None
    target_ports: bool = False
    dynamic: bool = False

    def _supported(self) -> str:
        modes = ", ".join(sorted(m.value for m in self.modes)) or "none"
        return f"provider {self.provider!r} cannot enforce (it supports: {modes})"

    def check_policy(self, policy: NetworkPolicy, phase: Phase) -> None:
        """Raise `NetworkPolicyUnsupported` unless every part of `policy` is enforceable."""
        where = f"the {phase!r} network policy ({policy})"
        if policy.network_mode not in self.modes:
            raise NetworkPolicyUnsupported(
                f"{where} uses mode {policy.network_mode.value!r}, which {self._supported()}; "
                f"override {phase!r} with a supported mode"
            )
        denylist = policy.network_mode is NetworkMode.DENYLIST
        for target in policy.targets:
            if denylist and self.denylist_entry_types is not None:
                if target.entry_type not in self.denylist_entry_types:
                    kinds = ", ".join(sorted(t.value for t in self.denylist_entry_types))
                    raise NetworkPolicyUnsupported(
                        f"{where}: entry {str(target)!r} is a {target.entry_type.value}, "
                        f"which provider {self.provider!r} cannot enforce in a denylist (it "
                        f"denies only: {kinds or 'none'}){_WHY.get(target.entry_type, '')}; "
                        f"override {phase!r}"
                    )
            elif target.entry_type not in self.entry_types:
                kinds = ", ".join(sorted(t.value for t in self.entry_types)) or "none"
                raise NetworkPolicyUnsupported(
                    f"{where}: entry {str(target)!r} is a {target.entry_type.value}, but "
                    f"provider {self.provider!r} enforces only: {kinds}; override {phase!r}"
                )
            if target.port is not None and not self.target_ports:
                raise NetworkPolicyUnsupported(
                    f"{where}: entry {str(target)!r} has a port, but provider "
                    f"{self.provider!r} cannot enforce ports; override {phase!r}"
                )

    def check_schedule(self, schedule: NetworkSchedule) -> None:
        """Check every phase; a static provider also needs one policy for all phases."""
        for phase, policy in schedule.items():
            self.check_policy(policy, phase)
        if self.dynamic:
            return
        for phase, policy in schedule.items():
            if policy != schedule.baseline:
                raise NetworkPolicyUnsupported(
                    f"provider {self.provider!r} cannot switch policy on a live sandbox, but the "
                    f"{phase!r} policy ({policy}) differs from baseline ({schedule.baseline}); "
                    f"override {phase!r} to match the baseline"
                )
