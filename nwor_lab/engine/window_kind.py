"""The window seam: what differs between a chain and a tree, asked by the step body (`run_step`),
the runner (bucket key, capture, reserve) and the engine (schedule, advance), never by name.

    ChainKind   nwor_lab.engine.window_chain: t_last + k drafts in plain rows, the EAGLE draft chain
    TreeKind    nwor_lab.engine.window_tree: t_last + N nodes (a TreeWindow), the next tree drafted

The engine picks one when it is built (`SpecEngine.window_kind`). `WindowKind` below is the
interface both follow (a typing Protocol: nothing inherits it, `tests/test_engine_tree.py` checks
both kinds have every member).
"""
from __future__ import annotations

from typing import Protocol


class WindowKind(Protocol):
    k: int               # draft slots a request in the sampler's layout (a tree engine's: 0, its prefills')
    lookahead: int       # positions past t_last one step may write (the scheduler's block budget)
    verify_rows: int     # rows a request slot of a decode bucket
    draft_rows: int      # rows a request slot of the head's draft window (0: no drafting)
    eager_reason: str | None   # why every step runs eagerly because of the kind (None: nothing)
    records_later: bool  # may a window's record be counted after the next step is launched (`flush_records`)

    # host, before the step
    def forced_tables(self, acceptance, device): ...                # forced acceptance's device tables
    def schedule(self, requests) -> list: ...                       # which scheduled requests share a step
    def capturable(self, runner) -> bool: ...                        # may this kind's steps replay graphs
    def bucket_key(self, engine, requests, static: bool, limits) -> tuple: ...   # the step's BucketKey (runner)
    def start_keys(self, runner) -> list: ...                       # buckets captured at start ([]: first use)
    def draft_width(self, k: int) -> int: ...                       # readback columns of the next window's drafts
    def fill(self, engine, inp, requests, limits) -> None: ...      # the requests into the buffers
    def draft_need(self, req, start: int, q: int, n: int) -> int: ...   # positions written, the draft window's too

    # device, the body (run_step)
    def verify(self, engine, inp): ...                    # -> (window, attention metadata)
    def accept(self, engine, inp, w, hidden): ...         # -> (sampled, Acceptance, accepted, kept rows)
    def head_ids(self, inp, w, sampled, accepted, kept): ...   # -> the token each row's head pass reads
    def draft(self, engine, inp, base, live, features): ...    # -> (packed pieces of the next window, probs)

    # host, after the readback
    def unpack(self, inp, rows): ...                      # -> (next drafts per request, parents or None)
    def host_window(self, h: dict, result): ...           # -> (host Window, Acceptance): record and trace
    def emitted(self, r, result, i: int, a: int) -> list[int]: ...    # the tokens request i emits
    def note(self, entry, h, result) -> None: ...         # what the kind adds to the window's trace
    def hand_out(self, engine, requests, result, live) -> list: ...   # next drafts -> [(request, slots)]
