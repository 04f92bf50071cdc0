"""Batch scheduler and the speculative decoding loop (EAGLE-1/-3 drafts, NWOR write policies, SCV).

  SpecEngine    continuous batching over one PagedKVCache; `step()` = one verify window
  Drafter       the EAGLE head's first draft and its draft chain (its own policy window)
  generate      run prompts to completion -> GenerationResult (texts, ids, per-window trace)
  prepare       the same set-up -> Generation, stepped by the caller (streaming, Ctrl-C)
"""
from nwor_lab.engine.drafter import Drafter
from nwor_lab.engine.engine import SpecEngine
from nwor_lab.engine.generate import Generation, GenerationResult, acceptance_stats, generate, prepare
from nwor_lab.engine.trace import WindowTrace

__all__ = ["SpecEngine", "Drafter", "generate", "prepare", "Generation", "GenerationResult", "acceptance_stats",
           "WindowTrace"]
