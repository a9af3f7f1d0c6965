"""Adapters that plug corral's providers into agent harnesses (Inspect, AgentCompass, Harbor).

Each adapter is one subpackage behind an extra; importing `corral` never imports them.
"""
