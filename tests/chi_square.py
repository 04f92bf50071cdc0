"""Pearson's chi-square of observed token counts against exact probabilities (no scipy here):
cells expected below 5 pooled into one, the critical value from the Wilson-Hilferty
approximation of the chi-square quantile (good to a few percent from 3 degrees of freedom)."""
import math

import torch

Z_1E4 = 3.719          # the standard normal's upper 1e-4 quantile: a fixed seed fails 1 run in 10k


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """counts `[V]` observed, probs `[V]` exact (summing to 1) -> (statistic, degrees of freedom)."""
    counts, probs = counts.double(), probs.double()
    n = float(counts.sum())
    expected = probs * n
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    if float(exp[-1]) < min_expected:      # the pooled cell too small: fold it into the largest
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
        i = int(exp.argmax())
        obs[i] += counts[small].sum()
        exp[i] += expected[small].sum()
    if bool(((exp == 0) & (obs > 0)).any()):
        return math.inf, len(exp) - 1          # a token the target gives probability 0
    stat = float(((obs - exp) ** 2 / exp.clamp_min(1e-300)).sum())
    return stat, len(exp) - 1


def critical(dof: int, z: float = Z_1E4) -> float:
    """The chi-square quantile with `dof` degrees of freedom at the normal quantile z."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


def assert_follows(counts: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    stat, dof = chi_square(counts, probs)
    assert dof >= 1, f"{what}: too few samples for a chi-square"
    assert stat < critical(dof), f"{what}: chi-square {stat:.1f} >= {critical(dof):.1f} ({dof} dof)"
