"""Batch scheduler and the speculative decoding loop (EAGLE-1/-3 drafts, NWOR write policies, SCV).

  SpecEngine    continuous batching over one PagedKVCache; `step()` = one verify window
  generate      run prompts to completion -> GenerationResult (texts, ids, per-window trace)
  cli_generate  the `nwor-lab generate` command
  bench         `python -m nwor_lab.engine.bench`: tokens/s target-only vs speculative (not a test)
"""
from nwor_lab.engine.cli import cli_generate
from nwor_lab.engine.engine import SpecEngine
from nwor_lab.engine.generate import GenerationResult, acceptance_stats, generate
from nwor_lab.engine.trace import WindowTrace

__all__ = ["SpecEngine", "generate", "GenerationResult", "acceptance_stats", "WindowTrace", "cli_generate"]
