"""The checker every exercise shares: run the user's function against the reference on many
cases (edge cases first, then random ones that grow), stop at the first disagreement, and report
it in a few readable lines with a picture.

An `Exercise` bundles what differs per exercise: the reference, the case generator, how to
compare two outputs, how to draw a counterexample, and what the learner sees around it (its
chapter, a "predict, then run" question, two hints).

A result is one of three states:
- `pass`: every case agreed;
- `fail`: the first counterexample, in words (inputs, expected, got, what differs) and a picture;
- `not attempted`: the function raised `NotImplementedError` on the first case (the untouched
  stub): no FAIL, no empty picture, just what to do next.

Outputs are compared strictly: a tensor of the dtype and shape the spec names, or the report says
which (an int32 answer where the spec says int64 fails, even when the numbers agree).
"""
from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

PASS, FAIL, NOT_ATTEMPTED = "pass", "fail", "not attempted"


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
class Prediction:
    """A "predict, then run" question: asked before the learner writes code, answered by running
    the reference on `inputs` (so the answer cannot drift from the spec).

    question: what to predict, with the numbers
    inputs:   keyword arguments of the reference
    answer:   reference output -> the value the learner predicts (an int, a list, ...)
    explain:  (answer) -> one or two sentences on why
    """

    question: str
    inputs: Callable[[], dict]
    answer: Callable[[object], object]
    explain: Callable[[object], str]


@dataclass
class Exercise:
    """One exercise, as its module declares it. Found by its name: the reference
    `solutions.<name>` (the spec is that function's docstring) and, in `catalogue.CATALOGUE`, its
    letter, title and chapter, so none of them is written twice."""

    name: str
    cases: Callable[[int, int], Iterator[Case]]        # (seed, n) -> cases
    compare: Callable[[object, object, Case], str | None]   # (expected, got, case) -> what differs, or None
    draw: Callable[[Case, object, object], object]     # (case, expected, got) -> go.Figure
    show: Callable[[object], str] = None               # output -> short text (falls back to repr if it raises)
    hints: tuple[str, ...] = ()                        # hint 1, hint 2 (the reference is the third)
    predict: Prediction | None = None
    letter: str = field(init=False)                    # "(a)" .. : how chapters and the kit name it
    title: str = field(init=False)                     # what the learner writes, in a few words
    chapter: str = field(init=False)                   # the chapter it lives in (file stem)

    def __post_init__(self):
        from nwor_lab.exercises.catalogue import ENTRIES
        if self.name not in ENTRIES:
            raise ValueError(f"Exercise(name={self.name!r}): no such row in nwor_lab/exercises/catalogue.py; "
                             f"add (letter, name, title, chapter) there first")
        self.letter, self.title, self.chapter = ENTRIES[self.name]

    @property
    def reference(self) -> Callable:
        from nwor_lab.exercises import solutions
        return getattr(solutions, self.name)

    def checker(self) -> Callable[..., "CheckResult"]:
        """`check_<name>(user_fn, n_cases=300, seed=0, *, show=None)`: this exercise's checker as a
        function of its own (what `exercises.check_<name>` is)."""
        def check(user_fn, n_cases: int = 300, seed: int = 0, *, show: bool | None = None) -> CheckResult:
            return run_check(self, user_fn, n_cases, seed, show=show)
        check.__name__ = check.__qualname__ = f"check_{self.name}"
        sig = inspect.signature(self.reference)
        check.__doc__ = (f"Check `user_fn({', '.join(sig.parameters)}) -> {sig.return_annotation}` against "
                         f"`solutions.{self.name}` on "
                         f"`n_cases` cases; prints PASS, the first counterexample, or \"not attempted yet\", and "
                         f"returns a CheckResult.")
        return check


@dataclass
class CheckResult:
    """What a checker found. `bool(result)` is True when every case passed.

    status: "pass", "fail" or "not attempted" (the stub still raises NotImplementedError).
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
    status: str = ""

    def __post_init__(self):
        self.status = self.status or (PASS if self.passed else FAIL)

    @property
    def attempted(self) -> bool:
        return self.status != NOT_ATTEMPTED

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
    """Run `user_fn` against `ex.reference` on `n_cases` cases; print PASS, the first
    counterexample, or "not attempted yet" for an untouched stub; display the counterexample's
    figure when `show` (default: only inside a Jupyter kernel)."""
    fmt = _shown_by(ex.show) if ex.show else _fmt
    result = None
    for i, case in enumerate(ex.cases(seed, n_cases)):
        expected = ex.reference(**_copy(case.inputs))
        try:
            got = user_fn(**_copy(case.inputs))
        except NotImplementedError as err:
            if i == 0:       # the stub as the chapter ships it: nothing to report against yet
                result = not_attempted(ex, n_cases, str(err))
            else:
                result = _failure(ex, i, n_cases, case, expected, None, f"NotImplementedError: {err}",
                                  f"raised NotImplementedError: {err} (a case your function does not handle yet)", fmt)
            break
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
    if result.status == FAIL and (show if show is not None else _in_kernel()):
        result.show()
    return result


def not_attempted(ex: Exercise, n_cases: int, why: str = "") -> CheckResult:
    where = f"exercise {ex.letter} " if ex.letter else ""
    message = (f"not attempted yet: {ex.name} — the stub still raises NotImplementedError. Write "
               f"{where}`{ex.name}`, then run this cell again "
               f"(hints: exercises.hints({ex.name!r}); nothing is compared until then)")
    return CheckResult(ex.name, False, n_cases, message, status=NOT_ATTEMPTED)


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
        # as wide as the cell that shows it: a fixed width is cut off, or crowds legend and titles
        figure.update_layout(width=None, autosize=True)
    except Exception as err:  # noqa: BLE001 - a broken output must not hide the report
        figure = None
        lines.append(f"  (no picture: {type(err).__name__}: {err})")
    return CheckResult(ex.name, False, n, "\n".join(lines), i, case, expected, got, error, figure)


def _shown_by(show: Callable[[object], str]) -> Callable[[object], str]:
    """An exercise's `show`, falling back to `repr` where the output is not what it can read (a wrong
    answer's shape must not break the report that names it)."""
    def fmt(x) -> str:
        try:
            return show(x)
        except Exception:  # noqa: BLE001 - an unreadable answer is reported as it is
            return repr(x)
    return fmt


def _copy(inputs: dict) -> dict:
    """Fresh copies, so a function that writes its inputs in place cannot change the next run's."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in inputs.items()}


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _fmt(x, limit: int = 24) -> str:
    """Short readable text of a tensor / tuple / number (long tensors are cut; the dtype is named
    unless it is the one a reader assumes: bool, int64, float32)."""
    if isinstance(x, tuple):
        return "(" + ", ".join(_fmt(v, limit) for v in x) + ")"
    if isinstance(x, torch.Tensor):
        if x.dim() > 2 or x.numel() > 4 * limit:
            return f"tensor of shape {list(x.shape)}, {dtype_name(x.dtype)}"
        values = x.tolist()
        if x.dim() == 1 and len(values) > limit:
            text = f"{values[:limit]} ... ({len(values)} values)"
        else:
            text = str(values)
        return text if x.dtype in (torch.bool, torch.int64, torch.float32) else f"{text} {dtype_name(x.dtype)}"
    return repr(x)


def as_tensor(x, dtype=None) -> torch.Tensor:
    """The user's output as a tensor (lists are accepted too) — for pictures, never for comparing."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t if dtype is None else t.to(dtype)


def tensor_problem(expected: torch.Tensor, got, what: str) -> str | None:
    """None if `got` is a tensor of `expected`'s dtype and shape, else one line saying what is off."""
    want = f"{dtype_name(expected.dtype)} tensor of shape {list(expected.shape)}"
    if not isinstance(got, torch.Tensor):
        return f"{what}: expected a {want}, got a {type(got).__name__} (return a torch.Tensor)"
    if got.dtype != expected.dtype:
        return (f"{what}: dtype {dtype_name(got.dtype)}, the spec says {dtype_name(expected.dtype)} "
                f"(expected a {want}, got shape {list(got.shape)})")
    if tuple(got.shape) != tuple(expected.shape):
        return f"{what}: shape {list(got.shape)}, expected {list(expected.shape)} ({want})"
    return None


def float_difference(expected: float, got, what: str, tolerance: float = 1e-9) -> str | None:
    """None if `got` is a Python float within `tolerance` of `expected` (relative or absolute), else
    one line saying what is off (a tensor or an int is not a float: the spec asks for `float(x)`)."""
    if isinstance(got, torch.Tensor) or not isinstance(got, float):
        return f"{what}: expected a Python float, got {type(got).__name__} {got!r} (return float(x))"
    if not math.isclose(got, expected, rel_tol=tolerance, abs_tol=tolerance):
        return f"{what}: expected {expected:.6g}, got {got:.6g}"
    return None


def first_difference(expected: torch.Tensor, got, what: str, index_name: str = "index") -> str | None:
    """None if `got` equals `expected` (dtype, shape and values; NaN equals NaN), else one line
    saying where it differs."""
    problem = tensor_problem(expected, got, what)
    if problem:
        return problem
    if not expected.numel():
        return None
    same = (got == expected)
    if expected.is_floating_point():
        same = same | (torch.isnan(got) & torch.isnan(expected))
    diff = ~same.reshape(expected.shape[0], -1).all(1)
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
