"""Providers: each a small package behind `corral.core`."""
