"""`python -m corral`: the same as the `corral` command."""

from corral.cli import app

app()
