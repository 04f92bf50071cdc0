"""Exercises in the GPU-Puzzles habit: a spec, a checker, a picture of the counterexample — one or
more in every teaching chapter.

The exercises (letter, name, title, chapter) are listed once, in `nwor_lab/exercises/catalogue.py`.

Each spec is the docstring of the reference in `nwor_lab.exercises.solutions`. Around each one a
chapter shows, in order:

    exercises.predict("slot_mapping", prediction)   # "predict, then run": answered by the reference
    print(exercises.spec("slot_mapping"))
    def slot_mapping(...): raise NotImplementedError  # the learner's stub
    exercises.check("slot_mapping", slot_mapping, use_solutions)
    exercises.hints("slot_mapping")                 # hint 1, hint 2, the reference: one click each

A checker runs the function on 300 cases (edge cases first), prints `PASS name (300 cases)`, the
first counterexample (`FAIL name: ...`, with a picture), or `not attempted yet: name ...` while the
stub still raises NotImplementedError, and returns a `CheckResult` (`.status`, `.figure`).
"""
from __future__ import annotations

import html
import importlib
import inspect

from nwor_lab.exercises import solutions
from nwor_lab.exercises.catalogue import NAMES
from nwor_lab.exercises.check import FAIL, NOT_ATTEMPTED, PASS, CheckResult, run_check

def exercise(name: str):
    """The `Exercise` behind `name` (reference, cases, letter, chapter, hints, prediction)."""
    if name not in NAMES:
        raise ValueError(f"name={name!r}: choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"nwor_lab.exercises.{name}").EXERCISE


def by_chapter() -> dict[str, list]:
    """Chapter stem -> its exercises, in letter order."""
    out: dict[str, list] = {}
    for ex in sorted((exercise(n) for n in NAMES), key=lambda e: e.letter):
        out.setdefault(ex.chapter, []).append(ex)
    return out


def choose(name: str, user_fn, use_solutions: bool = False):
    """`solutions.<name>` when `use_solutions` (CI and instructors run the chapters that way), else `user_fn`."""
    reference = exercise(name).reference
    return reference if use_solutions else user_fn


def spec(name: str) -> str:
    """The spec of exercise `name` (the reference's docstring)."""
    return exercise(name).reference.__doc__


def check(name: str, user_fn, use_solutions: bool = False, *, n_cases: int = 300, seed: int = 0,
          show: bool | None = None) -> CheckResult:
    """Run exercise `name`'s checker on `user_fn` (or on the reference when `use_solutions`)."""
    return run_check(exercise(name), choose(name, user_fn, use_solutions), n_cases, seed, show=show)


class Hints:
    """The progressive hints of one exercise: hint 1, hint 2, then the reference itself. In a
    notebook each is a closed <details> you open when stuck; as text, how to ask for one."""

    def __init__(self, name: str):
        self.name = name
        ex = exercise(name)
        self.items = list(ex.hints) + [inspect.getsource(ex.reference)]

    def __getitem__(self, i: int) -> str:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def _repr_html_(self) -> str:
        titles = [f"Hint {i + 1}" for i in range(len(self.items) - 1)] + ["The reference (a spoiler: try the hints first)"]
        blocks = []
        for i, (t, body) in enumerate(zip(titles, self.items)):
            inner = (f"<pre>{html.escape(body)}</pre>" if i == len(self.items) - 1
                     else f"<p>{html.escape(body)}</p>")
            blocks.append(f'<details class="nwor-hint"><summary>{t} · {html.escape(self.name)}</summary>{inner}</details>')
        return "\n".join(blocks)

    def __repr__(self) -> str:
        return (f"{len(self.items) - 1} hints for {self.name}, then the reference: "
                f"exercises.hint({self.name!r}, 1), ..., exercises.hint({self.name!r}, {len(self.items)})")


def hints(name: str) -> Hints:
    """Hint 1, hint 2 and the reference of exercise `name`, each closed until you open it."""
    return Hints(name)


def hint(name: str, n: int) -> None:
    """Print hint `n` (1, 2, ...; the last is the reference's source)."""
    items = Hints(name)
    if not 1 <= n <= len(items):
        raise ValueError(f"n={n}: {name} has hints 1..{len(items)} (the last is the reference)")
    print(items[n - 1])


class PredictionResult:
    def __init__(self, name, question, guess, answer, explain):
        self.name, self.question, self.guess, self.answer, self.explain = name, question, guess, answer, explain

    @property
    def right(self) -> bool | None:
        return None if self.guess is None else self.guess == self.answer

    def __repr__(self) -> str:
        head = f"Predict, then run · {self.name}: {self.question}"
        if self.guess is None:
            return f"{head}\n  your prediction: (none yet — set `prediction = ...` in this cell and run it again)"
        verdict = "right" if self.right else "not quite"
        return f"{head}\n  your prediction: {self.guess!r} — {verdict}. The reference says {self.explain}"


def predict(name: str, guess=None) -> PredictionResult:
    """The "predict, then run" question of exercise `name`; with a guess, the reference's answer and why
    (shown when it ends a cell, or with print)."""
    p = exercise(name).predict
    answer = p.answer(exercise(name).reference(**p.inputs()))
    return PredictionResult(name, p.question, guess, answer, p.explain(answer))


# `check_<name>`: each exercise's checker as a function of its own, made by its `Exercise` (the
# tests call these; chapters call `check(name, ...)`)
for _name in NAMES:
    globals()[f"check_{_name}"] = exercise(_name).checker()
del _name

__all__ = ["solutions", "CheckResult", "PASS", "FAIL", "NOT_ATTEMPTED", "NAMES", "exercise", "by_chapter", "choose",
           "spec", "check", "hints", "hint", "predict", "Hints", *(f"check_{n}" for n in NAMES)]
