"""The hybrid pair chapter 13 runs, greedy decoding of it under each state strategy, and one verify
window through every strategy at the layer level (no plotting here; `state_window.py` and
`state_costs.py` draw).

`hybrid_pair(model)` takes the shipped hybrid checkpoint (`nwor_lab.model.shipped.HYBRID_DIR`, loaded
like the tiny pair) when it exists, else a toy hybrid with random weights and a
fixed seed (`nwor_lab.model.toy.toy_hybrid` plus an EAGLE-1 head whose fc passes the token's
embedding through, as tests/test_engine_hybrid.py builds it): the chapter runs on either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nwor_lab.config import LabConfig
from nwor_lab.window import Acceptance, Window

MODELS = ("auto", "shipped", "toy")


@dataclass
class HybridPair:
    target: object                  # HybridForCausalLM
    head: object                    # EAGLE head attached to it
    tokenizer: object | None        # tokenizers.Tokenizer (shipped) or None (toy: token ids are shown)
    source: str                     # what was loaded, in words

    def encode(self, prompt) -> list[int]:
        """A prompt as token ids: text through the tokenizer, or a list of ids as given."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {prompt!r}: the toy hybrid has no tokenizer; give token ids "
                                 f"(lists of ints below {self.target.config.vocab_size})")
            return self.tokenizer.encode(prompt).ids
        return [int(t) for t in prompt]

    def show(self, token: int) -> str:
        """One token as the figures label it: its text (shipped), or its id (toy)."""
        if self.tokenizer is None:
            return str(token)
        return self.tokenizer.decode([token]).replace("\n", "⏎") or "·"


def shipped_hybrid_dir() -> Path | None:
    """The shipped hybrid checkpoint's directory (`nwor_lab.model.shipped.HYBRID_DIR`), or None while
    this build ships none."""
    from nwor_lab.model import shipped
    d = getattr(shipped, "HYBRID_DIR", None)
    return Path(d) if d is not None and (Path(d) / "config.json").is_file() else None


def _load_shipped(directory: Path, device) -> HybridPair:
    """The shipped hybrid pair (laid out like the tiny pair: its config.json says `nwor_hybrid`, the
    EAGLE-1 head, tokenizer.json) through the shipped pairs' loader."""
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny(device=device, directory=directory)
    if not hasattr(target, "state_spec"):
        raise ValueError(f"{directory}: holds a model without recurrent state ({type(target).__name__}), not a hybrid")
    return HybridPair(target.eval(), head.eval(), tok, f"the shipped hybrid pair ({directory.name}: gated DeltaNet "
                                                       f"+ attention, EAGLE-1 head)")


@torch.no_grad()
def toy_hybrid_pair(seed: int = 2, device="cpu") -> HybridPair:
    """A random hybrid target (3 gated DeltaNet layers, 1 attention layer) and an EAGLE-1 head whose
    fc passes the next token's embedding through: it drafts well enough that windows both accept
    and reject."""
    from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head
    target = toy_hybrid(seed)
    head = toy_hybrid_head(target, seed + 1)
    return HybridPair(target.to(device).eval(), head.to(device).eval(), None,
                      f"a toy hybrid (random weights, seed {seed}; no hybrid checkpoint is shipped in this build)")


def hybrid_pair(model: str = "auto", seed: int = 2, device="cpu") -> HybridPair:
    """model: `auto` (the shipped hybrid if this build has one, else the toy), `shipped` or `toy`."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}: choose one of {', '.join(MODELS)}")
    d = shipped_hybrid_dir() if model != "toy" else None
    if d is not None:
        return _load_shipped(d, device)
    if model == "shipped":
        raise FileNotFoundError("model='shipped': this build ships no hybrid checkpoint "
                                "(nwor_lab.model.shipped.HYBRID_DIR); use model='auto' or 'toy'")
    return toy_hybrid_pair(seed, device)


def decode(pair: HybridPair, prompts: list[list[int]], k: int, new_tokens: int, state_mode: str = "auto",
           nwor_mode: str = "stage", block_size: int = 16) -> dict:
    """Greedy decoding of `prompts` (token ids) by the lab's engine; k = 0: target-only.
    -> {"tokens": per prompt, "drafted", "accepted", "windows"} (verify windows with drafts)."""
    from nwor_lab.engine import SpecEngine
    config = LabConfig(nwor_mode=nwor_mode if k else "off", state_mode=state_mode if k else "auto")
    engine = SpecEngine(pair.target, pair.head if k else None, config, k=k, block_size=block_size,
                        max_num_seqs=len(prompts))
    reqs = [engine.add_request(p, new_tokens) for p in prompts]
    engine.run()
    verify = [t for t in engine.trace if t.kind == "verify" and sum(t.drafted)]
    return {"tokens": [list(r.output) for r in reqs], "drafted": sum(sum(t.drafted) for t in verify),
            "accepted": sum(sum(t.accepted) for t in verify), "windows": len(verify)}


def window_walk(spec, k: int, accepted: int, seed: int = 0) -> dict:
    """One request's verify window (t_last + k drafts, `accepted` of them kept) through every state
    strategy, one layer advanced. -> {"candidates": [k+1, ...] the states after t_last, d_1 .. d_k
    (one layer), "rows": per strategy {"strategy", "commits" (index of the candidate the store holds
    after commit, or None), "bytes_kept_peak", "rows_recomputed", "store_rows"}}."""
    from nwor_lab.ops.gated_delta import causal_conv_reference, gated_delta_recurrent_reference
    from nwor_lab.ops.generators import gated_delta_inputs
    from nwor_lab.state import STATE_POLICIES, RecurrentSpec, make_state_policy, make_state_store
    one = RecurrentSpec(num_layers=1, num_heads=spec.num_heads, head_k_dim=spec.head_k_dim, head_v_dim=spec.head_v_dim,
                        conv_dim=spec.conv_dim, conv_width=spec.conv_width)
    inp = gated_delta_inputs(k + 1, one.num_heads, one.head_k_dim, one.head_v_dim, one.conv_dim, one.conv_width,
                             seed=seed)
    args = [inp[t] for t in ("q", "k", "v", "g", "beta")]
    _, candidates = gated_delta_recurrent_reference(*args, state=inp["state"], keep_from=0)     # [k+1, H, K, V]
    _, history = causal_conv_reference(inp["x"], inp["weight"], inp["conv_state"])
    W = one.conv_width
    window = Window.from_counts([k + 1], [k], torch.arange(k + 1))
    rows = []
    for name in STATE_POLICIES:
        config = LabConfig(state_mode=name, backend="torch")
        store = make_state_store(config, one, 1, k)
        store.recurrent[0, 0, 0] = inp["state"]
        store.conv[0, 0, 0] = inp["conv_state"]
        policy = make_state_policy(config, store)
        policy.begin(window, [0])
        policy.conv(0, inp["x"], inp["weight"])
        policy.recur(0, *args)
        policy.commit(Acceptance.from_accepted_len(window, [accepted]))
        state, conv = store.committed(0, 0)
        commits = next((j for j in range(k + 1) if torch.equal(state, candidates[j])
                        and torch.equal(conv, history[j + 1:j + W])), None)
        rows.append({"strategy": name, "commits": commits, "bytes_kept_peak": policy.stats["bytes_kept_peak"],
                     "rows_recomputed": policy.stats["rows_recomputed"], "store_rows": store.rows_per_slot})
    return {"candidates": candidates, "rows": rows}
