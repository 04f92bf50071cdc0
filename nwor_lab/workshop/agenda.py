"""The workshop's two agendas, from the chapters' measured run times: a three-hour path and a full day.

An agenda is data: a sequence of lines, one per chapter it teaches or demonstrates, and its breaks.
Every slot is **added up, never scaled**: a chapter's slot is its run time (measured by the kit's
build: the room waits while it runs live; a chapter the build did not run uses its notes'
`run_estimate_s`, and says so) plus the line's stated **talk** and **hands-on** minutes, rounded up
to a whole minute. What is left of the day goes to the wrap-up's questions; a day whose slots do
not fit says by how much (`Plan.over_min`), and the kit prints it.

- The **three-hour path** (`THREE_HOUR`) is a choice: which chapters are *taught* (run, explained,
  exercised), which are *demos* (run and explained; their exercises are homework), and every other
  chapter is *homework*, or *self-paced* when its notes keep it out of any day (`in_agenda=False`).
- The **full day** (`FULL_DAY`) teaches every chapter that has notes, in order, with each chapter's
  own plan (`ChapterNotes.talk_min`, `hands_on_min`); a new chapter joins it with its notes line,
  and joins the three-hour path with one `Line` here (or stays homework there).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from nwor_lab.workshop import notes as notes_mod

TAUGHT, DEMO, HOMEWORK, SELF_PACED = "taught", "demo", "homework", "self-paced"
DEFAULT_TALK_MIN = 5.0          # a built chapter without notes, on the full day


@dataclass(frozen=True)
class Line:
    """One chapter of an agenda: taught (talk + hands-on) or a demo (talk only)."""
    stem: str
    role: str
    talk_min: float
    hands_on_min: float = 0.0

    def __post_init__(self):
        if self.role not in (TAUGHT, DEMO):
            raise ValueError(f"Line({self.stem!r}): role={self.role!r}; an agenda line is {TAUGHT!r} or {DEMO!r} "
                             f"(homework and self-paced chapters get no line)")
        if self.role == DEMO and self.hands_on_min:
            raise ValueError(f"Line({self.stem!r}): a demo has no hands-on minutes (its exercises are homework); "
                             f"make it {TAUGHT!r} or drop hands_on_min")


@dataclass(frozen=True)
class Break:
    minutes: int
    title: str = "Break"


@dataclass(frozen=True)
class Agenda:
    name: str
    title: str
    total_min: int
    lines: tuple = ()               # Line and Break, in order; () = every chapter with notes, from its notes
    breaks_after: tuple = ()        # for the notes-driven day: (stem, Break) pairs
    setup_min: int = notes_mod.SETUP_MIN
    wrap_up_min: int = notes_mod.WRAP_UP_MIN


THREE_HOUR = Agenda("three-hour", "Three hours", 180, lines=(
    Line("00_tour", TAUGHT, talk_min=8, hands_on_min=4),
    Line("01_why", DEMO, talk_min=8),
    Line("02_paged_cache", TAUGHT, talk_min=6, hands_on_min=5),
    Line("03_verify_window", TAUGHT, talk_min=6, hands_on_min=8),      # two exercises
    Line("04_scv", DEMO, talk_min=5),
    Break(10),
    Line("05_stage", TAUGHT, talk_min=8, hands_on_min=6),
    Line("06_cow", DEMO, talk_min=5),
    Line("07_sliding_window", DEMO, talk_min=5),
    Line("08_eagle", TAUGHT, talk_min=6, hands_on_min=5),
    Break(10),
    Line("13_state", TAUGHT, talk_min=10, hands_on_min=9),
    Line("14_trees", TAUGHT, talk_min=10, hands_on_min=9),
    Line("11_performance", DEMO, talk_min=7),
))

FULL_DAY = Agenda("full-day", "A full day", 420, breaks_after=(
    ("04_scv", Break(15, "Break")), ("08_eagle", Break(60, "Lunch")), ("12_exercises", Break(15, "Break"))),
    wrap_up_min=10)

AGENDAS = {a.name: a for a in (THREE_HOUR, FULL_DAY)}


@dataclass
class Slot:
    kind: str                  # "setup", "chapter", "break" or "wrap-up"
    title: str
    start_min: int = 0
    minutes: int = 0
    stem: str = ""
    role: str = ""             # taught or demo, for a chapter
    run_s: float = 0.0
    run_measured: bool = False
    talk_min: float = 0.0
    hands_on_min: float = 0.0
    note: str = ""             # why a run time is an estimate, or why a chapter is not in the build

    @property
    def clock(self) -> str:
        end = self.start_min + self.minutes
        return f"{self.start_min // 60}:{self.start_min % 60:02d}–{end // 60}:{end % 60:02d}"

    def as_dict(self) -> dict:
        return {**asdict(self), "clock": self.clock}


@dataclass
class Plan:
    agenda: Agenda
    slots: list = field(default_factory=list)
    homework: list = field(default_factory=list)     # stems: their exercises (and the demos' exercises) after the day
    self_paced: list = field(default_factory=list)   # stems their notes keep out of any day
    over_min: int = 0                                 # > 0: the slots need this much more than total_min

    @property
    def fits(self) -> bool:
        return self.over_min == 0

    def as_dict(self) -> dict:
        return {"name": self.agenda.name, "title": self.agenda.title, "total_min": self.agenda.total_min,
                "fits": self.fits, "over_min": self.over_min, "slots": [s.as_dict() for s in self.slots],
                "homework": self.homework, "self_paced": self.self_paced}


def in_agenda(stem: str) -> bool:
    """Whether chapter `stem` may get a slot on a day (its notes can keep it self-paced)."""
    n = notes_mod.for_chapter(stem)
    return n is None or n.in_agenda


def _lines(agenda: Agenda, stems: list[str]) -> list:
    if agenda.lines:
        return list(agenda.lines)
    out, after = [], dict(agenda.breaks_after)
    for stem in stems:
        n = notes_mod.for_chapter(stem)
        talk, hands = (n.talk_min, n.hands_on_min) if n else (DEFAULT_TALK_MIN, 0.0)
        out.append(Line(stem, TAUGHT if hands else DEMO, talk, hands))
        if stem in after:
            out.append(after[stem])
    return out


def _run_time(stem: str, b) -> tuple[float, bool, str]:
    """(seconds, measured, note) for a chapter: the build's measurement, else the notes' estimate."""
    n = notes_mod.for_chapter(stem)
    estimate = n.run_estimate_s if n else 60.0
    if b is not None and b.status == "ok":
        return b.seconds, True, ""
    if b is not None:
        return estimate, False, f"run time estimated: not run in this build ({b.status}: {b.error or ''})".rstrip(": ")
    why = (n.pending if n and n.pending else "chapter not found")
    return estimate, False, f"not in this build: {why}; slot reserved with an estimated run time"


def plan(built, agenda: Agenda = THREE_HOUR) -> Plan:
    """`agenda` for the chapters of a build (`kit.Built`s, in order): every slot added up from the run
    time and the line's talk and hands-on minutes; what is left goes to the wrap-up."""
    by_stem = {b.name: b for b in built}
    known = sorted(set(by_stem) | set(notes_mod.NOTES))
    self_paced = [s for s in known if not in_agenda(s)]
    lines = _lines(agenda, [s for s in known if in_agenda(s)])
    slots = [Slot("setup", "Set-up: every laptop runs 00's first cells (the install is pre-work: see Before the day)",
                  minutes=agenda.setup_min)]
    for item in lines:
        if isinstance(item, Break):
            slots.append(Slot("break", item.title, minutes=item.minutes))
            continue
        n, b = notes_mod.for_chapter(item.stem), by_stem.get(item.stem)
        run_s, measured, note = _run_time(item.stem, b)
        minutes = math.ceil(run_s / 60 + item.talk_min + item.hands_on_min - 1e-9)
        title = n.short if n else (b.title if b else item.stem)
        slots.append(Slot("chapter", title, minutes=minutes, stem=item.stem, role=item.role, run_s=run_s,
                          run_measured=measured, talk_min=item.talk_min, hands_on_min=item.hands_on_min, note=note))
    used = sum(s.minutes for s in slots) + agenda.wrap_up_min
    left = agenda.total_min - used
    slots.append(Slot("wrap-up", "Wrap-up: what NWOR buys, where it matters, questions"
                      + (f" (with {left} min to spare)" if left > 0 else ""),
                      minutes=agenda.wrap_up_min + max(0, left)))
    clock = 0
    for s in slots:
        s.start_min = clock
        clock += s.minutes
    placed = {s.stem for s in slots if s.kind == "chapter"}
    homework = [s for s in known if s not in placed and s not in self_paced]
    return Plan(agenda, slots, homework, self_paced, over_min=max(0, -left))


def plans(built) -> dict[str, Plan]:
    """Both agendas for one build, by name."""
    return {name: plan(built, a) for name, a in AGENDAS.items()}
