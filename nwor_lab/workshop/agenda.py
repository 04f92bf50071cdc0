"""The workshop's three-hour agenda, from the chapters' measured run times.

Each section is one chapter: its **run time** as measured by this build (the room waits while it
runs live; a chapter that did not run here uses its notes' estimate, and says so), plus the
instructor's plan for **talk** and **hands-on** minutes (`nwor_lab.workshop.notes`). A set-up slot
(the environments checked; installing them is pre-work, `notes.SETUP`), a break and a wrap-up are fixed. The talk and hands-on minutes are scaled together so the day is exactly
`total_min` long, then rounded to whole minutes (largest remainders first, so the sum stays exact).
A chapter in the notes that is not in the build (its kernel missing, or `pending`) keeps its slot with
its estimate; a built chapter without notes gets a default plan of five minutes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from nwor_lab.workshop import notes as notes_mod

DEFAULT_TALK_MIN = 5.0
TOTAL_MIN = 180


@dataclass
class Slot:
    kind: str                  # "setup", "chapter", "break" or "wrap-up"
    title: str
    start_min: int = 0
    minutes: int = 0
    stem: str = ""
    run_s: float = 0.0
    run_measured: bool = False
    talk_min: float = 0.0      # after scaling
    hands_on_min: float = 0.0
    note: str = ""             # why a run time is an estimate, or why a chapter is not in the build

    @property
    def clock(self) -> str:
        end = self.start_min + self.minutes
        return f"{self.start_min // 60}:{self.start_min % 60:02d}–{end // 60}:{end % 60:02d}"

    def as_dict(self) -> dict:
        return {**asdict(self), "clock": self.clock}


def in_agenda(stem: str) -> bool:
    """Whether chapter `stem` gets a slot of the day (its notes can keep it self-paced, after the day)."""
    n = notes_mod.for_chapter(stem)
    return n is None or n.in_agenda


def plan(built, total_min: int = TOTAL_MIN) -> list[Slot]:
    """The agenda for the chapters of a build (`kit.Built`s, in order) and the notes' pending chapters."""
    by_stem = {b.name: b for b in built}
    stems = sorted(stem for stem in set(by_stem) | set(notes_mod.NOTES) if in_agenda(stem))
    sections = []
    for stem in stems:
        n, b = notes_mod.for_chapter(stem), by_stem.get(stem)
        talk, hands = (n.talk_min, n.hands_on_min) if n else (DEFAULT_TALK_MIN, 0.0)
        if b is not None and b.status == "ok":
            run_s, measured, note = b.seconds, True, ""
        elif b is not None:
            run_s, measured = (n.run_estimate_s if n else 60.0), False
            note = f"run time estimated: not run in this build ({b.status}: {b.error or ''})".rstrip(": ")
        else:
            run_s, measured = n.run_estimate_s, False
            note = f"not in this build: {n.pending or 'chapter not found'}; slot reserved with an estimated run time"
        title = n.short if n else (b.title if b else stem)
        sections.append(Slot("chapter", title, stem=stem, run_s=run_s, run_measured=measured, talk_min=talk,
                             hands_on_min=hands, note=note))
    fixed = notes_mod.SETUP_MIN + notes_mod.BREAK_MIN + notes_mod.WRAP_UP_MIN + sum(s.run_s for s in sections) / 60
    planned = sum(s.talk_min + s.hands_on_min for s in sections)
    scale = max(0.0, (total_min - fixed) / planned) if planned else 0.0
    for s in sections:
        s.talk_min, s.hands_on_min = round(s.talk_min * scale, 1), round(s.hands_on_min * scale, 1)
    raw = [s.run_s / 60 + (s.talk_min + s.hands_on_min) for s in sections]
    whole = _round_to(raw, max(len(sections), total_min - notes_mod.SETUP_MIN - notes_mod.BREAK_MIN
                               - notes_mod.WRAP_UP_MIN))
    for s, m in zip(sections, whole):
        s.minutes = m
    after = next((i for i, s in enumerate(sections) if s.stem == notes_mod.BREAK_AFTER), len(sections) // 2 - 1)
    slots = ([Slot("setup", "Set-up: every laptop runs 00's first cells (the install is pre-work: see Before the day)",
                   minutes=notes_mod.SETUP_MIN)] + sections[:after + 1]
             + [Slot("break", "Break", minutes=notes_mod.BREAK_MIN)] + sections[after + 1:])
    slots.append(Slot("wrap-up", "Wrap-up: what NWOR buys, where it matters, questions", minutes=notes_mod.WRAP_UP_MIN))
    clock = 0
    for s in slots:
        s.start_min = clock
        clock += s.minutes
    return slots


def _round_to(values: list[float], total: int) -> list[int]:
    """Whole minutes (at least 1 each) summing to `total`, closest to `values` scaled to it."""
    if not values:
        return []
    scale = total / sum(values) if sum(values) else 0
    exact = [v * scale for v in values]
    whole = [max(1, int(x)) for x in exact]
    order = sorted(range(len(values)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(whole) < total:
        whole[order[i % len(order)]] += 1
        i += 1
    while sum(whole) > total:
        j = max(range(len(whole)), key=lambda k: whole[k] - exact[k])
        whole[j] -= 1
    return whole
