"""What a prefill-to-decode hand-off ships of a request: one class per strategy, each declaring it.

    nwor       committed rows only: the full committed blocks and the committed rows of the last,
               partial block, every cache layer (the target's and the head's layer N), the state
    write_all  whole blocks: the partial block travels whole, so the rows past `num_computed`
               travel too (junk: under write-all they hold the prefill step's rejected drafts, the
               head's draft chain among them); exact in tokens, since nothing reads a position
               before the window that owns it writes it again
    no_head    as nwor but without the head's layer N (SGLang #31600, vLLM #54926: the draft
               model's K/V is not carried): the decode engine's head attends to a prompt it never
               saw; greedy tokens stay exact (the target verifies), acceptance falls; at T > 0
               its other drafts draw other random numbers (a sample of the same distribution,
               not the same sample)
    no_state   as nwor but without a hybrid target's recurrent / conv state slot: the decode
               engine starts from a cleared state, its tokens are not the target's (a failure kept
               to be measured, as the field's lost draft state of SGLang #23539)

`HANDOFF_STRATEGIES` is the registry (names from it); a new strategy is a subclass registered there.
Nothing outside a strategy compares strategy names: callers read `rows`, `ships_head`,
`ships_state`, `exact_greedy`, `exact_sampled` and `keeps_acceptance`.
"""
from __future__ import annotations

from typing import ClassVar

from nwor_lab.config import Names, Registry


class HandoffStrategy:
    """One way of shipping a request's stores; the class attributes are its declaration."""

    name: ClassVar[str] = ""
    whole_blocks: ClassVar[bool] = False     # ship every row of the last partial block (junk rows past num_computed)
    ships_head: ClassVar[bool] = True        # the head's cache layer N travels
    ships_state: ClassVar[bool] = True       # a hybrid target's recurrent / conv state slot travels
    exact_greedy: ClassVar[bool] = True      # the decode engine's tokens equal one engine's, greedy
    exact_sampled: ClassVar[bool] = True     # ... and at T > 0 with the same seed (same drafts, same draws)
    keeps_acceptance: ClassVar[bool] = True  # ... and so does its acceptance
    summary: ClassVar[str] = ""

    def shipped_positions(self, num_computed: int, block_size: int) -> int:
        """Positions 0 .. n-1 of the request shipped (every shipped layer alike)."""
        if self.whole_blocks:
            return -(-num_computed // block_size) * block_size
        return num_computed

    def shipped_layers(self, target_layers: int, cache_layers: int) -> list[int]:
        """Cache layers shipped: the target's 0 .. N-1, and the head's N .. when the strategy ships it."""
        return list(range(cache_layers if self.ships_head else target_layers))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Nwor(HandoffStrategy):
    summary = "committed rows only (full committed blocks + the partial block's committed rows), head and state"


class WriteAll(HandoffStrategy):
    whole_blocks = True
    summary = "whole blocks: the partial block's rows past num_computed travel (junk under write-all)"


class NoHead(HandoffStrategy):
    ships_head = False
    exact_sampled = False      # other drafts draw other random numbers: a valid sample, not the same one
    keeps_acceptance = False
    summary = "committed rows of the target's layers only: the head's K/V left behind (the field's failure)"


class NoState(HandoffStrategy):
    ships_state = False
    exact_greedy = False
    exact_sampled = False
    keeps_acceptance = False
    summary = "committed rows, head included, without a hybrid target's state slot (decodes from a cleared state)"


handoff_names = Names(())
HANDOFF_STRATEGIES = Registry(handoff_names, HandoffStrategy, "HANDOFF_STRATEGIES.register")
for _name, _cls in (("nwor", Nwor), ("write_all", WriteAll), ("no_head", NoHead), ("no_state", NoState)):
    HANDOFF_STRATEGIES.register(_name, _cls)


def handoff_strategy(name) -> HandoffStrategy:
    """The strategy registered as `name` (an instance passes through)."""
    if isinstance(name, HandoffStrategy):
        return name
    if name not in HANDOFF_STRATEGIES:
        raise ValueError(f"strategy={name!r}: choose one of {', '.join(handoff_names())} "
                         f"(nwor_lab.disagg.HANDOFF_STRATEGIES)")
    return HANDOFF_STRATEGIES[name]()
