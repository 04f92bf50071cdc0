"""The workshop around the chapters in `notebooks/`: what a clean chapter is (`chapters`) and the
kit that executes and exports them all (`kit`, `nwor-lab workshop build`)."""
from nwor_lab.workshop.cli import add_parsers, main

__all__ = ["add_parsers", "main"]
