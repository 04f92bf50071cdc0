"""Dense (cache-free) greedy EAGLE simulation: the acceptance-length oracle used after training.

Every step recomputes the whole sequence, so it is slow but independent of the paged engine;
the engine's greedy speculative run must give the same tokens and acceptance lengths.
"""
from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def speculate_dense(target, head, prompt: list[int], new_tokens: int, k: int):
    """Greedy speculative decoding of one prompt -> (generated ids, tokens produced per verify window)."""
    dev = next(target.parameters()).device
    seq = list(prompt)

    def features(ids):
        """-> (final-norm hidden [S, h], the head's first-pass features [S, h])."""
        if not head.aux_layers:
            f = target.forward_dense(torch.tensor([ids], device=dev))[0]
            return f, f
        f, aux = target.forward_dense(torch.tensor([ids], device=dev), aux_layers=head.aux_layers)
        return f[0], head.features_from_target(f[0], aux[0])

    h, f = features(seq)
    seq.append(int(target.compute_logits(h[-1]).argmax()))  # t_last from the prefill
    per_window = []
    while len(seq) - len(prompt) < new_tokens:
        # f holds the target features of seq[:-1]; head rows p use (seq[p+1], f[p]).
        ids = torch.tensor([seq[1:]], device=dev)
        feats = f[None, :len(seq) - 1]
        drafts = []
        for _ in range(k):
            g = head.forward_dense(ids, feats)[0, -1]
            d = int(head.compute_logits(g).argmax())
            drafts.append(d)
            ids = torch.cat([ids, torch.tensor([[d]], device=dev)], dim=1)
            feats = torch.cat([feats, g[None, None].to(feats.dtype)], dim=1)
        h_all, f_all = features(seq + drafts)
        want = target.compute_logits(h_all[len(seq) - 1:]).argmax(-1).tolist()  # k+1 greedy tokens
        a = 0
        while a < k and drafts[a] == want[a]:
            a += 1
        seq += drafts[:a] + [want[a]]
        f = f_all[:len(seq) - 1]
        per_window.append(a + 1)
    return seq[len(prompt):len(prompt) + new_tokens], per_window


def held_out_prompts(data: np.ndarray, n: int, length: int, seed: int = 7) -> list[list[int]]:
    """`n` prompts of `length` tokens from the held-out token stream."""
    gen = np.random.default_rng(seed)
    starts = gen.integers(0, data.size - length, size=n)
    return [data[s:s + length].astype(np.int64).tolist() for s in starts]


def acceptance_length(target, head, prompts, new_tokens: int, k: int) -> float:
    windows = [w for p in prompts for w in speculate_dense(target, head, p, new_tokens, k)[1]]
    return float(np.mean(windows))
