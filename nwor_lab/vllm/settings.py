"""The plugin's settings: vLLM's `additional_config["nwor_lab"]`, the lab's `NWOR_LAB_*` variables
as the fallback, checked once, at engine start, into one object.

    additional_config={"nwor_lab": {
        "nwor_mode": "off" | "cow" | "stage",   # the write policy (LabConfig.nwor_mode)
        "scv_mode":  "off" | "graph" | "adaptive",
        "debug":     bool,   # log every window; assert committed == vLLM's accepted count
        "validate":  bool,   # the lab's host-side slot and mask checks (default false here: vLLM built
                             #   the slots and the sampler output; true checks them every window)
        "check":     bool,   # after every window, compare vLLM's cache bytes with the invariants
                             #   (cow/stage: rejected slots bit-identical; kept rows = what was written)
        "record":    "path.jsonl",   # one JSON line per window (WindowRecord + vLLM's step)
    }}

A key that is not in the dict falls back to its `NWOR_LAB_*` variable (`NWOR_LAB_NWOR_MODE`,
`NWOR_LAB_SCV_MODE`, `NWOR_LAB_DEBUG`, `NWOR_LAB_VALIDATE`, `NWOR_LAB_VLLM_CHECK`,
`NWOR_LAB_VLLM_RECORD`), then to the default. The plugin is active only when `additional_config`
has the `"nwor_lab"` key (an empty dict activates it with the fallbacks).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from nwor_lab.config import LabConfig, parse_bool

KEYS = ("nwor_mode", "scv_mode", "debug", "validate", "check", "record")
ENV = {"check": "NWOR_LAB_VLLM_CHECK", "record": "NWOR_LAB_VLLM_RECORD"}


class SettingsError(ValueError):
    """A bad `additional_config["nwor_lab"]` value: one line naming the key, the value, the fix."""


@dataclass(frozen=True)
class NworSettings:
    lab: LabConfig               # nwor_mode, scv_mode, debug, validate (backend: torch on CPU)
    check: bool = False
    record: str | None = None

    @classmethod
    def from_dict(cls, given, environ=None) -> "NworSettings":
        env = os.environ if environ is None else environ
        if not isinstance(given, dict):
            raise SettingsError(f'additional_config["nwor_lab"]={given!r}: expected a dict of {", ".join(KEYS)}')
        unknown = sorted(set(given) - set(KEYS))
        if unknown:
            raise SettingsError(f'additional_config["nwor_lab"]: unknown key(s) {", ".join(map(repr, unknown))}; '
                                f'the keys are {", ".join(KEYS)}')
        try:
            lab = LabConfig.from_env(LabConfig(backend="torch", validate=False), environ=env)
            changes = {}
            for key in ("nwor_mode", "scv_mode"):
                if key in given:
                    changes[key] = given[key]
            for key in ("debug", "validate"):
                if key in given:
                    changes[key] = _bool(key, given[key])
            lab = lab.replace(**changes)
        except (TypeError, ValueError) as e:
            raise SettingsError(f'additional_config["nwor_lab"]: {e}') from None
        check = _bool("check", given["check"]) if "check" in given else \
            parse_bool(ENV["check"], env.get(ENV["check"], "0"))
        record = given.get("record", env.get(ENV["record"]) or None)
        if record is not None and (not isinstance(record, str) or not record.strip()):
            raise SettingsError(f'additional_config["nwor_lab"]["record"]={record!r}: give a file path '
                                f'(".jsonl") or leave it out')
        return cls(lab=lab, check=check, record=record)

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "NworSettings | None":
        """The settings of an engine, or None when the plugin is not configured for it."""
        extra = getattr(vllm_config, "additional_config", None)
        if not isinstance(extra, dict) or "nwor_lab" not in extra:
            return None
        return cls.from_dict(extra["nwor_lab"])

    def describe(self) -> str:
        c = self.lab
        return (f"nwor_mode={c.nwor_mode} scv_mode={c.scv_mode} debug={c.debug} validate={c.validate} "
                f"check={self.check} record={self.record or '-'}")


def _bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return parse_bool(key, value)
        except ValueError as e:
            raise SettingsError(f'additional_config["nwor_lab"]: {e}') from None
    raise SettingsError(f'additional_config["nwor_lab"]["{key}"]={value!r}: expected true or false')
