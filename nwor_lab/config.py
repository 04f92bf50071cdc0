"""One configuration object for the lab: write policy, SCV mode, backend, debug.

Nothing here reads the environment implicitly: `LabConfig.from_env()` applies the sweep
overrides (`NWOR_LAB_NWOR_MODE`, `NWOR_LAB_SCV_MODE`, `NWOR_LAB_BACKEND`, `NWOR_LAB_DEBUG`,
`NWOR_LAB_VALIDATE`) on top of explicit values, so a notebook always sees the state it runs with.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

NWOR_MODES = ("off", "cow", "stage")   # the built-in write policies (nwor_lab.policies registers them)
SCV_MODES = ("off", "graph", "adaptive")
BACKENDS = ("auto", "cuda", "torch")

# Write policies registered beyond the built-ins (`nwor_lab.policies.register_policy`): LabConfig
# accepts their names too. Kept here, not in policies/, so the config needs nothing above it.
_extra_nwor_modes: list[str] = []

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(name: str, text: str) -> bool:
    """`1/0, true/false, yes/no, on/off` (any case) -> bool; anything else names `name` and fails."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={text!r}: expected one of 1/0, true/false, yes/no, on/off")


def env_bool(name: str, default: bool = False, environ=None) -> bool:
    """The boolean environment switch `name` (unset: `default`); the lab's one env-bool parser."""
    env = os.environ if environ is None else environ
    return default if name not in env else parse_bool(name, env[name])


def nwor_modes() -> tuple[str, ...]:
    """Every write-policy name LabConfig accepts: the built-ins, then registered ones."""
    return NWOR_MODES + tuple(_extra_nwor_modes)


def add_nwor_mode(name: str) -> None:
    """Called by `register_policy` so that `LabConfig(nwor_mode=name)` is accepted."""
    if name not in nwor_modes():
        _extra_nwor_modes.append(name)


@dataclass(frozen=True)
class LabConfig:
    """Which write policy and SCV mode run, on which backend.

    nwor_mode: `off` (write every scheduled token, vLLM today), `cow` (log draft slots, write,
        restore rejected), `stage` (keep the window in a staging buffer, commit accepted only).
    scv_mode:  `off` (per-request host loop), `graph` / `adaptive` (vectorised; on CUDA captured
        in a CUDA graph, `adaptive` falling back to eager when capture is impossible).
    backend:   `auto` (CUDA extension for CUDA tensors when it builds, else torch reference),
        `cuda` (extension required: a build failure is an error), `torch` (reference only).
    debug:     log each window's lifecycle and assert committed == accepted every window.
    validate:  check slot ranges and mask shapes on the host (a device sync on GPU); skipped
        automatically while a CUDA graph is being captured.
    """

    nwor_mode: str = "off"
    scv_mode: str = "off"
    backend: str = "auto"
    debug: bool = False
    validate: bool = True

    def __post_init__(self) -> None:
        for field, allowed in (("nwor_mode", nwor_modes()), ("scv_mode", SCV_MODES), ("backend", BACKENDS)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"LabConfig.{field}={value!r}: choose one of {', '.join(allowed)}")

    def replace(self, **changes) -> "LabConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, base: "LabConfig | None" = None, environ=None) -> "LabConfig":
        """`base` (default: the defaults) with the `NWOR_LAB_*` environment overrides applied."""
        env = os.environ if environ is None else environ
        cfg = base or cls()
        changes = {}
        for var, field in (("NWOR_LAB_NWOR_MODE", "nwor_mode"), ("NWOR_LAB_SCV_MODE", "scv_mode"),
                           ("NWOR_LAB_BACKEND", "backend")):
            if env.get(var):
                changes[field] = env[var].strip().lower()
        for var, field in (("NWOR_LAB_DEBUG", "debug"), ("NWOR_LAB_VALIDATE", "validate")):
            if var in env:
                changes[field] = parse_bool(var, env[var])
        try:
            return cfg.replace(**changes)
        except ValueError as err:
            raise ValueError(f"{err} (from the NWOR_LAB_* environment)") from None
