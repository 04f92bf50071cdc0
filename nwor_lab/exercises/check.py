"""The checker every exercise shares: run the user's function against the reference on many
cases (edge cases first, then random ones that grow), stop at the first disagreement, and report
it in a few readable lines with a picture.

An `Exercise` bundles what differs per exercise: the reference, the case generator, how to
compare two outputs, and how to draw a counterexample.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch


@dataclass
class Case:
    """One input of an exercise.

    inputs:  keyword arguments of the function under test
    note:    what the case is about ("edge: all padding", "random")
    context: what the picture needs but the function does not get (cache geometry, the window)
    """

    inputs: dict
    note: str = "random"
    context: dict = field(default_factory=dict)


@dataclass
class Exercise:
    name: str
    reference: Callable
    cases: Callable[[int, int], Iterator[Case]]        # (seed, n) -> cases
    compare: Callable[[object, object, Case], str | None]   # (expected, got, case) -> what differs, or None
    draw: Callable[[Case, object, object], object]     # (case, expected, got) -> go.Figure
    show: Callable[[object], str] = None               # output -> short text


@dataclass
class CheckResult:
    """What a checker found. `bool(result)` is True when every case passed.

    On failure: `case` (inputs, note), `expected`, `got` (or `error`: what the function raised),
    `message` (the printed report) and `figure` (the counterexample's picture).
    """

    exercise: str
    passed: bool
    n_cases: int
    message: str
    case_index: int | None = None
    case: Case | None = None
    expected: object = None
    got: object = None
    error: str | None = None
    figure: object = None

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return self.message

    def show(self) -> None:
        """Display the counterexample's figure (in a notebook)."""
        if self.figure is not None:
            _display(self.figure)


def run_check(ex: Exercise, user_fn: Callable, n_cases: int = 300, seed: int = 0, *,
              show: bool | None = None, verbose: bool = True) -> CheckResult:
    """Run `user_fn` against `ex.reference` on `n_cases` cases; print PASS or the first
    counterexample; display its figure when `show` (default: only inside a Jupyter kernel)."""
    fmt = ex.show or _fmt
    result = None
    for i, case in enumerate(ex.cases(seed, n_cases)):
        expected = ex.reference(**_copy(case.inputs))
        try:
            got = user_fn(**_copy(case.inputs))
        except Exception as err:  # noqa: BLE001 - any failure of the user's code is a counterexample
            error = f"{type(err).__name__}: {err}"
            result = _failure(ex, i, n_cases, case, expected, None, error, f"raised {error}", fmt)
            break
        diff = ex.compare(expected, got, case)
        if diff is not None:
            result = _failure(ex, i, n_cases, case, expected, got, None, diff, fmt)
            break
    if result is None:
        result = CheckResult(ex.name, True, n_cases, f"PASS {ex.name} ({n_cases} cases)")
    if verbose:
        print(result.message)
    if not result.passed and (show if show is not None else _in_kernel()):
        result.show()
    return result


def _failure(ex, i, n, case, expected, got, error, diff, fmt) -> CheckResult:
    lines = [f"FAIL {ex.name}: case {i + 1} of {n} ({case.note})"]
    width = max(len(k) for k in case.inputs) if case.inputs else 0
    for k, v in case.inputs.items():
        lines.append(f"  {k:<{width}} = {_fmt(v)}")
    lines.append(f"  expected: {fmt(expected)}")
    lines.append(f"  got:      {fmt(got) if error is None else '(no result)'}")
    lines.append(f"  {diff}")
    try:
        figure = ex.draw(case, expected, got)
    except Exception as err:  # noqa: BLE001 - a broken output must not hide the report
        figure = None
        lines.append(f"  (no picture: {type(err).__name__}: {err})")
    return CheckResult(ex.name, False, n, "\n".join(lines), i, case, expected, got, error, figure)


def _copy(inputs: dict) -> dict:
    """Fresh copies, so a function that writes its inputs in place cannot change the next run's."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in inputs.items()}


def _fmt(x, limit: int = 24) -> str:
    """Short readable text of a tensor / tuple / number (long tensors are cut)."""
    if isinstance(x, tuple):
        return "(" + ", ".join(_fmt(v, limit) for v in x) + ")"
    if isinstance(x, torch.Tensor):
        if x.dim() > 2 or x.numel() > 4 * limit:
            return f"tensor of shape {list(x.shape)}, {str(x.dtype).replace('torch.', '')}"
        values = x.tolist()
        if x.dim() == 1 and len(values) > limit:
            return f"{values[:limit]} ... ({len(values)} values)"
        return str(values)
    return repr(x)


def as_tensor(x, dtype=None) -> torch.Tensor:
    """The user's output as a tensor (lists are accepted too)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t if dtype is None else t.to(dtype)


def first_difference(expected: torch.Tensor, got, what: str, index_name: str = "index") -> str | None:
    """None if `got` equals `expected` (shape and values), else one line saying where it differs."""
    try:
        got = as_tensor(got)
    except Exception as err:  # noqa: BLE001
        return f"{what}: could not read it as a tensor ({type(err).__name__}: {err})"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{what}: shape {list(got.shape)}, expected {list(expected.shape)}"
    if expected.dtype == torch.bool:
        got = got.bool()
    diff = (got.to(expected.dtype) != expected).reshape(expected.shape[0], -1).any(1) \
        if expected.numel() else torch.zeros(0, dtype=torch.bool)
    if not bool(diff.any()):
        return None
    i = int(diff.nonzero()[0])
    return (f"{what}: first difference at {index_name} {i}: expected {_fmt(expected[i])}, "
            f"got {_fmt(got[i])}")


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and hasattr(ip, "kernel")


def _display(figure) -> None:
    from IPython.display import display
    display(figure)
