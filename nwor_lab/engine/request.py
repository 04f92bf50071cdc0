"""A request's state between windows.

`tokens = prompt + output`; the LAST token (`t_last`) was sampled but not yet run, so its K/V is
not in the cache. `num_computed` positions (target and EAGLE-head layers alike) hold committed
K/V; after every window `num_computed == len(tokens) - 1`, except after a chunk of a chunked
prefill (`chunk`: the scheduler's token budget for this step cut the prefill), which leaves
`num_computed` short of the prompt and samples nothing. Rejected drafts roll nothing back in
the cache's bookkeeping but `num_computed`: it only advances by the committed tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import check_int
from nwor_lab.kv import BlockTable


def check_prompt(name: str, prompt, vocab_size: int) -> list[int]:
    """A prompt of token ids -> `list[int]`, each id an integer in `[0, vocab_size)`.

    Accepts a list/tuple of Python or numpy ints, or a 1-D integer tensor. A float id (which
    `int()` would silently truncate), a bool, or a string (which would be read as characters) is
    refused by name.
    """
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise TypeError(f"{name}: expected a 1-D integer tensor of token ids, got {prompt.dtype} "
                            f"of shape {tuple(prompt.shape)}")
        ids = prompt.tolist()
    elif isinstance(prompt, (list, tuple)):
        ids = []
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not hasattr(t, "__index__"):
                raise TypeError(f"{name}[{i}]={t!r}: token ids are integers (a {type(t).__name__} "
                                f"would be truncated); pass a list of ints")
            ids.append(t.__index__())
    else:
        raise TypeError(f"{name}: expected a list of token ids (or text with a tokenizer), got "
                        f"{type(prompt).__name__}")
    if not ids:
        raise ValueError(f"{name}: empty; give at least one token")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = next(i for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise ValueError(f"{name}[{bad}]={ids[bad]}: token ids must be in 0..{vocab_size - 1} "
                         f"(the model's vocab_size is {vocab_size})")
    return ids


def fit_context(name: str, prompt: list[int], max_new_tokens: int, max_model_len: int,
                truncate: bool = False) -> list[int]:
    """Check that prompt + max_new_tokens fits the model's `max_model_len` positions
    (max_position_embeddings); with `truncate`, keep the prompt's last tokens that fit instead."""
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    if max_new_tokens >= max_model_len:
        raise ValueError(f"max_new_tokens={max_new_tokens}: the model has {max_model_len} positions "
                         f"(max_position_embeddings), so at most {max_model_len - 1} new tokens after a "
                         f"one-token prompt; lower max_new_tokens")
    room = max_model_len - max_new_tokens
    if len(prompt) <= room:
        return prompt
    if truncate:
        return prompt[-room:]
    raise ValueError(f"{name}: {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceed the model's "
                     f"{max_model_len} positions (max_position_embeddings); shorten the prompt, lower "
                     f"max_new_tokens, or truncate_prompts=True to keep the prompt's last {room} tokens")


@dataclass
class Request:
    req_id: int
    prompt: list[int]
    max_new_tokens: int
    block_table: BlockTable
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    drafts: list[int] = field(default_factory=list)       # proposed for the next verify window
    draft_probs: torch.Tensor | None = None              # [len(drafts), V] when sampling, else None
    draft_parents: list[int] | None = None                # with trees: node i+1's parent (0 = t_last)
    finished: bool = False
    worst_case_blocks: int = 0                            # the most blocks it can hold (checked at admission)
    acceptance_key: int = 0                               # forced acceptance: a hash of the prompt
    state_slot: int | None = None                         # a hybrid target's recurrent-state slot
    swapped: object | None = None                         # its stores in host memory while swapped out
    generator: torch.Generator | None = None              # its own random stream at T > 0 (per-request seed)
    preemptions: int = 0                                  # times it was preempted
    aborted: bool = False                                 # engine.abort(): its tokens so far stay
    chunk: int | None = None                              # the most prefill tokens this step (the scheduler's)

    @property
    def tokens(self) -> list[int]:
        """prompt + output, a new list (its length and single tokens: `num_tokens`, `token_at`,
        which the per-step checks use instead of copying the whole context every call)."""
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token_at(self, i: int) -> int:
        """tokens[i] for 0 <= i < num_tokens, without building `tokens`."""
        n = len(self.prompt)
        return self.prompt[i] if i < n else self.output[i - n]

    @property
    def is_prefill(self) -> bool:
        """More than t_last is still to compute: a new request, one whose prompt prefix came from the
        prefix cache (num_computed = the hit length, a whole number of blocks), one whose computed
        positions were given up (num_computed set back), or one part way through a chunked prefill."""
        return self.num_computed < max(len(self.prompt), self.num_tokens - 1)

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.max_new_tokens - len(self.output)

    def keep_drafts(self, n: int) -> None:
        """Verify only the first `n` drafts (a prefix of a draft chain is still a valid proposal)."""
        self.drafts = self.drafts[:n]
        if self.draft_parents is not None:      # a tree's nodes are listed parents first: a prefix is a tree
            self.draft_parents = self.draft_parents[:n]
        if self.draft_probs is not None:
            self.draft_probs = self.draft_probs[:n]

    def scheduled(self) -> tuple[list[int], int, int]:
        """(token ids, first position, number of drafts) of this request's next window: the tokens
        not yet computed, from position num_computed on, then the drafts. A prefill's is the prompt
        past its prefix-cache hit (all of it without one; no drafts; prompt + output so far after a
        preemption by recompute: the prefill samples the token after them), at most `chunk` of them
        (chunked prefill); a decode's `[t_last, d_1 .. d_n]`."""
        if self.is_prefill:
            todo = self.tokens[self.num_computed:]
            return (todo if self.chunk is None else todo[:self.chunk]), self.num_computed, 0
        return [self.token_at(self.num_tokens - 1)] + list(self.drafts), self.num_computed, len(self.drafts)

    def chunk_next(self, scheduled: tuple[list[int], int, int] | None = None) -> int:
        """The token after this step's rows when they end before the request's last token (a chunk
        of a chunked prefill that is not its last: it samples nothing, and the head's row at its end
        reads this prompt token), else -1 (the step samples the token after its rows).
        `scheduled`: this step's `scheduled()`, when the caller has it already."""
        toks, start, n = self.scheduled() if scheduled is None else scheduled
        end = start + len(toks) - n
        return self.token_at(end) if end < self.num_tokens else -1


def check_request_generator(engine, generator) -> None:
    """Refuse a per-request `generator` the engine cannot honour, by name: not a torch.Generator, on
    another device, a tree window (its acceptance draws from the engine's generator only), forced
    acceptance (its uniforms come from the prompt's key), or steps captured in CUDA graphs (which rows
    redraw is a host decision each step; `LabConfig(cuda_graph=False)` keeps them eager). The CUDA
    path of per-request generators is untested here (no GPU where this was written)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator (e.g. torch.Generator().manual_seed(7)) or None, "
                        f"got {type(generator).__name__}")
    if generator.device.type != engine.device.type:
        raise ValueError(f"generator: on {generator.device}, the engine runs on {engine.device}; make it there "
                         f"(torch.Generator({str(engine.device)!r}))")
    if engine.tree is not None:
        raise ValueError(f"generator: per-request generators with LabConfig.tree={engine.config.tree!r} are not "
                         f"built (a tree's acceptance draws from the engine's generator); use chains (tree='')")
    if engine.acceptance is not None:
        raise ValueError("generator: per-request generators with forced acceptance: its drafts are accepted by "
                         "the prompt's key, not drawn; leave generator=None")
    if engine.runner.capture:
        raise ValueError("generator: per-request generators cannot run in captured steps (which rows redraw is "
                         "decided on the host each step); build the engine with LabConfig(cuda_graph=False)")
