"""The `nwor-lab` command: one module per command family, dispatched by `main`."""
from nwor_lab.cli.main import main

__all__ = ["main"]
