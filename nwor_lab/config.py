"""One configuration object for the lab: write policy, SCV mode, backend, sliding window, debug.

Nothing here reads the environment implicitly: `LabConfig.from_env()` applies the sweep
overrides (`NWOR_LAB_NWOR_MODE`, `NWOR_LAB_SCV_MODE`, `NWOR_LAB_BACKEND`, `NWOR_LAB_ATTENTION`,
`NWOR_LAB_KV_RING`, `NWOR_LAB_STATE_MODE`, `NWOR_LAB_SLIDING_WINDOW`, `NWOR_LAB_TREE`, `NWOR_LAB_PREFIX_CACHE`,
`NWOR_LAB_PREEMPTION`, `NWOR_LAB_DEBUG`, `NWOR_LAB_VALIDATE`, `NWOR_LAB_CUDA_GRAPH`) on top of explicit values, so a notebook always sees the state it runs with.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

# The built-in write policies and state strategies, named here only so that a LabConfig is checked
# without importing nwor_lab.policies / nwor_lab.state (they sit above config). Nothing else reads
# these two: every list of names (flags, benches, chapters) reads `nwor_modes()` / `state_modes()`,
# which the registries fill (`register_policy`, `register_state_policy`), built-ins first in this
# order (tests/test_policy_registry.py holds the registries to it).
NWOR_MODES = ("off", "cow", "stage")
SCV_MODES = ("off", "graph", "adaptive")
BACKENDS = ("auto", "cuda", "torch")
ATTENTION_BACKENDS = ("auto", "triton", "torch")       # verify-window attention (nwor_lab.model.attention)
CACHE_DTYPE_NAMES = ("auto", "fp8_e4m3", "fp8_e5m2")   # KV cache storage (nwor_lab.kv.CACHE_DTYPES)
KV_LAYOUTS = ("NHD", "HND", "VLLM_CPU")                # the cache layouts of nwor_lab.kv (kv.layout.CACHE_LAYOUTS)
# How a hybrid model's recurrent + conv state is kept under speculative decoding (nwor_lab.state):
# `auto` takes the strategy the write policy declares (`WritePolicy.state_counterpart`).
STATE_MODES = ("auto", "off", "snapshots", "cow", "replay", "stage")
# How a sliding-window cache is kept (LabConfig.kv_ring; nwor_lab.kv.ring has the arithmetic):
KV_RINGS = ("auto", "ring", "slack", "full", "guard")
# What the engine does with a request whose blocks it takes away (nwor_lab.engine.preemption reads
# these; LabConfig.preemption):
PREEMPTION_MODES = ("recompute", "swap")
# The keys of LabConfig.prefix_cache, in their canonical order (nwor_lab.engine.prefix_settings
# .PrefixCacheConfig's fields: it holds the defaults and checks the strategy names, which live in
# registries above config); host_blocks is a count, the others are names.
PREFIX_CACHE_KEYS = ("head_cache", "lookahead", "host_blocks", "offload")


class Names:
    """The names one LabConfig field accepts, in order: the built-ins, then each name a registry
    adds (`add`, called by the registry's `register_*`; `drop` undoes it). Call it for the tuple."""

    def __init__(self, builtins: tuple[str, ...]):
        self._names = list(builtins)

    def __call__(self) -> tuple[str, ...]:
        return tuple(self._names)

    def add(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip().lower():
            raise ValueError(f"name={name!r}: give a non-empty lower-case name without surrounding spaces "
                             f"(what a flag and NWOR_LAB_* accept)")
        if name not in self._names:
            self._names.append(name)

    def drop(self, name: str) -> None:
        if name in self._names:
            self._names.remove(name)


class Registry(dict):
    """name -> class of one kind (write policies, state strategies), each name one a LabConfig field
    accepts. `register(name, cls)` checks `cls` is a `base`, sets `cls.name`, keeps the class and adds
    the name to the field's `names`; `pop(name)` takes both back (a test's throwaway entry)."""

    def __init__(self, names: Names, base: type, what: str):
        super().__init__()
        self.names, self.base, self.what = names, base, what

    def register(self, name: str, cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{self.what}({name!r}, ...): expected a {self.base.__name__} subclass, got {cls!r}")
        self.names.add(name)
        cls.name = name
        self[name] = cls
        return cls

    def pop(self, name: str, *default):
        self.names.drop(name)
        return super().pop(name, *default)


# What each field accepts: nwor_lab.policies registers every write policy, nwor_lab.state every
# state strategy (through a Registry over these).
nwor_modes = Names(NWOR_MODES)
state_modes = Names(STATE_MODES)

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


@dataclass(frozen=True)
class LabConfig:
    """Which write policy and SCV mode run, on which backend.

    nwor_mode: `off` (write every scheduled token, vLLM today), `cow` (log draft slots, write,
        restore rejected), `stage` (keep the window in a staging buffer, commit accepted only).
    scv_mode:  `graph` (default) / `adaptive` (vectorised; on CUDA captured in a CUDA graph, `adaptive`
        falling back to eager when capture is impossible), `off` (per-request host loop: the same
        acceptance, but a step with drafts can then not be captured, so it runs eagerly).
    backend:   `auto` (CUDA extension for CUDA tensors when it builds, else torch reference),
        `cuda` (extension required: a build failure is an error), `torch` (reference only).
    attention: `auto` (the Triton paged verify-window kernel for CUDA tensors when Triton imports,
        else the torch reference), `triton` (kernel required), `torch` (reference only).
    cuda_graph: on CUDA (with the Triton attention), replay the engine's step body from one CUDA
        graph per bucket (`nwor_lab.engine.runner`); False keeps every step eager.
    sliding_window: W > 0: a query at position q attends keys q - W + 1 .. q in every layer, the
        target's and the draft head's (0: the whole context).
    kv_ring:   with a sliding window, how each request's cache is kept (one line each):
        `ring`  a ring of W slots (position p at p mod W); the write policy decides correctness
                (`off` is wrong once the ring wraps, `cow` and `stage` are exact);
        `slack` a ring of W + k slots, every row written (llama.cpp's SWA cache): exact;
        `full`  no ring: every position kept, memory grows with the context: exact;
        `guard` a ring of W slots, drafts cut so no write can evict a needed position (mlx-lm's
                fallback: no speculation once the ring has wrapped): exact;
        `auto`  `ring` for a policy that keeps a ring exact (`WritePolicy.keeps_ring_exact`), else
                `slack`: never wrong.
    state_mode: how a hybrid model's recurrent and conv state (gated DeltaNet layers) is kept
        across a verify window (nwor_lab.state): `off` (advanced through every row: wrong after a
        rejection), `snapshots` (a state per window position, the accepted one picked: vLLM),
        `cow` (checkpoint, restore and re-advance on reject: llama.cpp), `replay` (keep the window's
        inputs, recompute over the accepted rows: ReplaySSM), `stage` (window states transient,
        only the accepted one committed); `auto` takes the write policy's declared counterpart
        (`WritePolicy.state_counterpart`: off -> off, cow -> cow, stage -> stage).
    tree:      draft trees instead of chains (nwor_lab.speculative.tree_window): "" (a chain), "topk=K,depth=D,nodes=N"
        (EAGLE-2's dynamic tree: expand the top-K children of the frontier for D levels, keep the best N
        nodes) or "paths=0|1|0.0|0.1" (a static tree: each path lists child ranks from t_last). Parsed
        and checked here (`tree_shape`); stored in its canonical spelling.
    prefix_cache: committed blocks outlive their request and a new prompt reuses them
        (nwor_lab.engine.prefix): "" (off), "on" (the defaults of `PrefixCacheConfig`), or some of
        "head_cache=cached,lookahead=boundary,host_blocks=64,offload=target_head" (the rest default).
        The form is checked here (`prefix_cache_settings`), the strategy names when the engine is
        built (they live in the engine's registries). `SpecEngine(prefix_cache=PrefixCacheConfig(...))`
        wins over this field left at "", and a different non-empty field is refused, naming both.
    preemption: when a step's blocks do not fit, the newest request is preempted by `recompute`
        (free its blocks, prefill again) or `swap` (its blocks to host memory and back)
        (nwor_lab.engine.preemption). `SpecEngine(preemption=Preemption(...))` wins over this field
        left at "recompute", and a different one is refused, naming both.
    debug:     log each window's lifecycle and assert committed == accepted every window; with a
        sliding window, name any read of a ring slot that no longer holds the position read.
    validate:  check slot ranges and mask shapes on the host (a device sync on GPU); skipped
        automatically while a CUDA graph is being captured.
    capture_at_start: with `cuda_graph` on CUDA, capture every bucket the engine can reach before its
        first step (`nwor_lab.engine.capture_sizes`: one log line, graphs and seconds), so no capture
        runs inside a later timed window; False captures each bucket on first use. Nothing captures on CPU.
    ride_dead: a request that may finish in a step does not keep the next step from being pre-launched
        (`StepRunner`: it rides that step dead, writing and drafting nothing), so the host's work stays
        hidden behind the GPU's; the price is a request that arrives as another finishes joining one
        step later (TTFT). False: such a step is laid out by the host, and the newcomer joins it.
    """

    nwor_mode: str = "off"
    scv_mode: str = "graph"
    backend: str = "auto"
    attention: str = "auto"
    cuda_graph: bool = True
    sliding_window: int = 0
    kv_ring: str = "auto"
    state_mode: str = "auto"
    tree: str = ""
    prefix_cache: str = ""
    preemption: str = "recompute"
    debug: bool = False
    validate: bool = True
    capture_at_start: bool = True
    ride_dead: bool = True

    def __post_init__(self) -> None:
        for field, allowed in (("nwor_mode", nwor_modes()), ("scv_mode", SCV_MODES), ("backend", BACKENDS),
                               ("attention", ATTENTION_BACKENDS), ("kv_ring", KV_RINGS),
                               ("state_mode", state_modes()), ("preemption", PREEMPTION_MODES)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"LabConfig.{field}={value!r}: choose one of {', '.join(allowed)}")
        w = self.sliding_window
        if isinstance(w, bool) or not hasattr(w, "__index__") or w.__index__() < 0:
            raise ValueError(f"LabConfig.sliding_window={w!r}: give the attention window W as an int >= 1 "
                             f"(0: attend to the whole context)")
        object.__setattr__(self, "sliding_window", w.__index__())
        shape = parse_tree("LabConfig.tree", self.tree)
        object.__setattr__(self, "tree", "" if shape is None else shape.spelling)
        object.__setattr__(self, "prefix_cache", prefix_cache_spelling(
            parse_prefix_cache("LabConfig.prefix_cache", self.prefix_cache)))
        for f in dataclasses.fields(self):      # every switch: a real bool ('no' and 'false' are truthy)
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise TypeError(f"LabConfig.{f.name}={value!r}: expected True or False, got {type(value).__name__}"
                                + (f" (text such as {value!r} counts as True; parse it with "
                                   f"nwor_lab.config.parse_bool)" if isinstance(value, str) else ""))

    @property
    def tree_shape(self) -> "TreeShape | None":
        """The parsed `tree` (None: chains)."""
        return parse_tree("LabConfig.tree", self.tree)

    @property
    def prefix_cache_settings(self) -> "dict | None":
        """The parsed `prefix_cache`: the keys given, {key: value} (None: off; {}: every default)."""
        return parse_prefix_cache("LabConfig.prefix_cache", self.prefix_cache)

    def replace(self, **changes) -> "LabConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, base: "LabConfig | None" = None, environ=None) -> "LabConfig":
        """`base` (default: the defaults) with the `NWOR_LAB_*` environment overrides applied."""
        env = os.environ if environ is None else environ
        cfg = base or cls()
        changes = {}
        for var, field, allowed in ENV_CHOICES:
            if env.get(var):
                value = env[var].strip().lower()
                choices = allowed()
                if value not in choices:
                    raise ValueError(f"LabConfig.{field}={env[var]!r} (from {var}): choose one of "
                                     f"{', '.join(choices)}, or unset {var}")
                changes[field] = value
        for var, field in ENV_BOOLS:
            if var in env:
                changes[field] = parse_bool(var, env[var])
        for var, field, parse in ENV_TEXT:
            if var in env:
                parse(f"LabConfig.{field} (from {var})", env[var])
                changes[field] = env[var].strip()
        for var, field in ENV_INTS:
            if env.get(var, "").strip():
                text = env[var].strip()
                if not text.isdigit():
                    raise ValueError(f"LabConfig.{field}={text!r} (from {var}): expected an integer >= 0, "
                                     f"or unset {var}")
                changes[field] = int(text)
        return cfg.replace(**changes)


def check_config(name: str, config) -> LabConfig:
    """`config` as a LabConfig (None: the defaults); anything else is a TypeError naming `name`."""
    if config is None:
        return LabConfig()
    if not isinstance(config, LabConfig):
        hint = f"LabConfig(nwor_mode={config!r})" if isinstance(config, str) else "LabConfig(...)"
        raise TypeError(f"{name}={config!r}: expected a nwor_lab.LabConfig, got {type(config).__name__}; "
                        f"pass e.g. {hint}")
    return config


# The environment overrides LabConfig.from_env reads: (variable, field, allowed values) and the
# boolean switches. `nwor-lab doctor` reports each of them (and NWOR_LAB_* names nobody reads).
ENV_CHOICES = (("NWOR_LAB_NWOR_MODE", "nwor_mode", nwor_modes), ("NWOR_LAB_SCV_MODE", "scv_mode", lambda: SCV_MODES),
               ("NWOR_LAB_BACKEND", "backend", lambda: BACKENDS),
               ("NWOR_LAB_ATTENTION", "attention", lambda: ATTENTION_BACKENDS),
               ("NWOR_LAB_KV_RING", "kv_ring", lambda: KV_RINGS),
               ("NWOR_LAB_STATE_MODE", "state_mode", state_modes),
               ("NWOR_LAB_PREEMPTION", "preemption", lambda: PREEMPTION_MODES))
ENV_BOOLS = (("NWOR_LAB_DEBUG", "debug"), ("NWOR_LAB_VALIDATE", "validate"), ("NWOR_LAB_CUDA_GRAPH", "cuda_graph"),
             ("NWOR_LAB_RIDE_DEAD", "ride_dead"))
ENV_INTS = (("NWOR_LAB_SLIDING_WINDOW", "sliding_window"),)
# text fields, each parsed by the field's own parser: (variable, field, parser(name, text))
ENV_TEXT = (("NWOR_LAB_TREE", "tree", lambda name, text: parse_tree(name, text)),
            ("NWOR_LAB_PREFIX_CACHE", "prefix_cache", lambda name, text: parse_prefix_cache(name, text)))


@dataclass(frozen=True)
class TreeShape:
    """A draft tree's shape: dynamic (topk, depth, nodes) or static (paths of child ranks)."""

    topk: int = 0
    depth: int = 0
    nodes: int = 0
    paths: tuple = ()

    @property
    def is_static(self) -> bool:
        return bool(self.paths)

    @property
    def spelling(self) -> str:
        if self.paths:
            return "paths=" + "|".join(".".join(map(str, p)) for p in self.paths)
        return f"topk={self.topk},depth={self.depth},nodes={self.nodes}"


TREE_HELP = ('give "topk=K,depth=D,nodes=N" (EAGLE-2: K >= 1 children per frontier node, D >= 1 levels, '
             'N <= K + (D - 1) * K^2 nodes) or "paths=0|1|0.0|0.1" (static: child ranks from t_last, each '
             'path\'s parent listed), or "" for chains')


def parse_tree(name: str, text) -> TreeShape | None:
    """`LabConfig.tree` text -> TreeShape (None: chains); anything malformed names `name` and the form."""
    if not isinstance(text, str):
        raise TypeError(f"{name}={text!r}: expected a string; {TREE_HELP}")
    t = text.strip().replace(" ", "")
    if t in ("", "chain"):
        return None
    if t.startswith("paths="):
        paths = []
        for part in t[len("paths="):].split("|"):
            ranks = part.split(".")
            if not part or not all(r.isdigit() for r in ranks):
                raise ValueError(f"{name}={text!r}: bad path {part!r}; {TREE_HELP}")
            paths.append(tuple(int(r) for r in ranks))
        have = set(paths)
        if len(have) != len(paths):
            raise ValueError(f"{name}={text!r}: a path is listed twice")
        for p in paths:
            if len(p) > 1 and p[:-1] not in have:
                raise ValueError(f"{name}={text!r}: path {'.'.join(map(str, p))} needs its parent "
                                 f"{'.'.join(map(str, p[:-1]))} listed too")
        return TreeShape(paths=tuple(sorted(paths, key=lambda p: (len(p), p))))
    fields = {}
    for part in t.split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in ("topk", "depth", "nodes") or key in fields or not value.isdigit():
            raise ValueError(f"{name}={text!r}: cannot read {part!r}; {TREE_HELP}")
        fields[key] = int(value)
    if set(fields) != {"topk", "depth", "nodes"}:
        missing = sorted({"topk", "depth", "nodes"} - set(fields))
        raise ValueError(f"{name}={text!r}: missing {', '.join(missing)}; {TREE_HELP}")
    k, d, n = fields["topk"], fields["depth"], fields["nodes"]
    if min(k, d, n) < 1:
        raise ValueError(f"{name}={text!r}: topk, depth and nodes must be >= 1; {TREE_HELP}")
    if n > k + (d - 1) * k * k:
        raise ValueError(f"{name}={text!r}: topk={k}, depth={d} propose at most {k + (d - 1) * k * k} nodes, "
                         f"not {n}; lower nodes or raise depth / topk")
    return TreeShape(topk=k, depth=d, nodes=n)


PREFIX_CACHE_HELP = ('give "" (off), "on" (the defaults) or comma-separated key=value pairs of '
                     + ", ".join(PREFIX_CACHE_KEYS) + ' (e.g. "head_cache=cached,lookahead=boundary,host_blocks=64,'
                     'offload=target_head"; host_blocks an integer >= 0, the others names)')


def parse_prefix_cache(name: str, text) -> dict | None:
    """`LabConfig.prefix_cache` text -> {key: value} of the keys given (None: off; {}: "on", every
    default), host_blocks as an int. Only the form is checked here; the strategy names are checked
    by `PrefixCacheConfig` when the engine is built (their registries sit above config)."""
    if not isinstance(text, str):
        raise TypeError(f"{name}={text!r}: expected a string; {PREFIX_CACHE_HELP}")
    t = text.strip().replace(" ", "").lower()
    if t in ("", "off"):
        return None
    if t == "on":
        return {}
    given = {}
    for part in t.split(","):
        key, eq, value = part.partition("=")
        if not eq or not value or key not in PREFIX_CACHE_KEYS:
            raise ValueError(f"{name}={text!r}: cannot read {part!r}; {PREFIX_CACHE_HELP}")
        if key in given:
            raise ValueError(f"{name}={text!r}: {key} is given twice")
        if key == "host_blocks":
            if not value.isdigit():
                raise ValueError(f"{name}={text!r}: host_blocks={value!r}: a number of host block slots, an "
                                 f"integer >= 0 (0: no host tier)")
            value = int(value)
        given[key] = value
    return {k: given[k] for k in PREFIX_CACHE_KEYS if k in given}


def prefix_cache_spelling(settings: dict | None) -> str:
    """The canonical `LabConfig.prefix_cache` text of parsed settings (None: "", {}: "on")."""
    if settings is None:
        return ""
    return ",".join(f"{k}={settings[k]}" for k in PREFIX_CACHE_KEYS if k in settings) or "on"


# -- scalar argument checks, shared by the engine and the CLI ------------------------------------
# Torch-free on purpose: the CLI checks its flags with them before it imports torch. `name` is
# what the caller calls the value (`max_num_seqs` in the API, `--max-num-seqs` on the command line).

INT64_MAX = 2 ** 63 - 1    # what torch (sizes, seeds) and the kernels' index types can hold


def check_int(name: str, value, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """`value` as an int (Python or numpy integer; never a bool or a float) in `minimum..maximum`
    (every int is bounded: past int64 torch fails with "Overflow when unpacking long long")."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}={value!r}: expected an integer, got {type(value).__name__}")
    value = value.__index__()
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value}: must be >= {minimum}")
    if value > maximum:
        raise ValueError(f"{name}={value}: must be <= {maximum}" + (" (int64)" if maximum == INT64_MAX else ""))
    return value


def check_temperature(name: str, value) -> float:
    """A finite float >= 0 (0 = greedy). NaN fails every comparison, so it is named explicitly."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r}: expected a number >= 0 (0 = greedy)") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{name}={value!r}: must be a finite number >= 0 (0 = greedy)")
    return t
