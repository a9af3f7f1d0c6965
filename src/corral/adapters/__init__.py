"""Adapters that plug corral's providers into agent harnesses (Inspect, AgentCompass, Harbor,
SWE-ReX, mini-swe-agent).

Each adapter is one subpackage behind an extra; importing `corral` never imports them.
`provider` (which provider, its config, the owner label) and `commands` are what they
share, and import no harness.
"""
