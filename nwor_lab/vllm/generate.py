"""Speculative decoding of the shipped pair inside vLLM, with the plugin, as the lab reports it.

    lab = VllmLab(method="eagle", k=4, nwor_mode="stage")      # one vLLM engine, in this process
    res = lab.generate(["def parse_args(argv):"], max_new_tokens=32)
    res.texts, res.mean_acceptance_length, res.acceptance_by_position, res.totals
    lab.generate(prompts, nwor_mode="cow")                     # the same engine, another policy
    lab.runtime.vc.cache                                       # vLLM's KV tensors as a lab cache

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the uni executor): one
start instead of three processes, no main guard needed, and the runtime, the policy and vLLM's
cache are Python objects a notebook can read. The statistics are the lab engine's own
(`engine.generate.acceptance_stats` over the runtime's trace of verify windows); vLLM's own
speculative-decoding counters are reported beside them (`vllm_metrics`).

`tp=2` runs vLLM's tensor parallelism: the engine core stays in this process, its two workers are
processes of their own (`distributed_executor_backend="mp"`, `VLLM_CPU_OMP_THREADS_BIND` from
`ranks.omp_bind` unless set), each with its runtime on its shard of KV heads. Everything below
reaches the workers through `collective_rpc`, so it reads the same for tp 1 and tp 2; the totals
count each window once (`ranks.merge_totals`), the trace is rank 0's after every rank's was
found equal (`ranks.compare_traces`), and `per_rank` keeps what each rank reported.

Engine settings the CPU backend needs: block_size a multiple of 32 (default 32),
`kv_cache_memory_bytes` (default 64 MiB; vLLM's automatic CPU memory check fails on small
machines), `enforce_eager` (no torch.compile on CPU here).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from nwor_lab.lifeline import environment

METHODS = ("eagle", "eagle3", "ngram", "none")


@dataclass
class VllmResult:
    texts: list[str]
    token_ids: list[list[int]]
    trace: list                          # WindowTrace per verify window (plugin active), in order
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    target_forwards: int
    seconds: float                       # wall time of llm.generate
    totals: dict = field(default_factory=dict)        # NworRuntime.totals for this call
    windows: list = field(default_factory=list)       # per window: vllm_step, kind, rejected_writes/_left, record
    vllm_metrics: dict = field(default_factory=dict)  # vLLM's spec-decode counters for this call
    nwor_mode: str | None = None
    per_rank: list = field(default_factory=list)      # each rank's report (rank, tp_rank, tp_size, totals)

    def summary(self) -> dict:
        return {"mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_by_position": self.acceptance_by_position,
                "target_forwards": self.target_forwards, "tokens": sum(len(t) for t in self.token_ids),
                "complete": True}


class VllmLab:
    """One in-process vLLM engine on the shipped pair, with (or without) the plugin."""

    def __init__(self, method: str = "eagle", k: int = 4, *, nwor_mode: str = "off", scv_mode: str = "off",
                 plugin: bool = True, debug: bool = False, check: bool = False, record: str | None = None,
                 dtype: str = "float32", block_size: int = 32, max_model_len: int = 1024,
                 kv_cache_memory_bytes: int = 64 << 20, max_num_seqs: int = 8, seed: int = 0,
                 keep_fc_bias: bool = True, models_root=None, source=None, extra: dict | None = None,
                 tp: int = 1):
        from nwor_lab.config import check_int
        if method not in METHODS:
            raise ValueError(f"method={method!r}: choose one of {', '.join(METHODS)}")
        k = check_int("k", k, 0 if method == "none" else 1)
        tp = check_int("tp", tp, 1)
        if check_int("block_size", block_size, 1) % 32:
            raise ValueError(f"block_size={block_size}: vLLM's CPU attention backend needs a multiple of 32")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        from nwor_lab.vllm import engine_kwargs
        from nwor_lab.vllm.checkpoints import prepare

        self.method, self.k, self.plugin, self.tp = method, (0 if method == "none" else k), plugin, tp
        self._stood_down = False
        dirs = prepare(models_root, source=source, keep_fc_bias=keep_fc_bias)
        spec = None
        if method in ("eagle", "eagle3"):
            spec = {"method": method, "model": str(dirs[method]), "num_speculative_tokens": k}
        elif method == "ngram":
            spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        kw = engine_kwargs(nwor_mode=nwor_mode, scv_mode=scv_mode, debug=debug, check=check,
                           **({"record": record} if record else {})) if plugin else {}
        parallel = {"distributed_executor_backend": "uni"}
        bind = {}
        self.omp_bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") if tp > 1 else None
        if tp > 1:
            from nwor_lab.vllm.ranks import omp_bind
            parallel = {"distributed_executor_backend": "mp", "tensor_parallel_size": tp}
            if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
                bind = {"VLLM_CPU_OMP_THREADS_BIND": omp_bind(tp)}
                self.omp_bind = bind["VLLM_CPU_OMP_THREADS_BIND"]
        if bind:
            # vLLM caches its environment variables once an engine has started in this process
            # (envs.enable_envs_cache); its own reset, so the workers spawned below read the binding
            from vllm import envs
            envs.disable_envs_cache()
        t0 = time.perf_counter()
        with environment(**bind):         # the workers read it when they are spawned, here
            self.llm = LLM(model=str(dirs["target"]), tokenizer=str(dirs["target"]), dtype=dtype,
                           block_size=block_size, kv_cache_memory_bytes=kv_cache_memory_bytes, speculative_config=spec,
                           max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed, enforce_eager=True,
                           disable_log_stats=False, **parallel, **kw, **(extra or {}))
        self.start_seconds = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()

    # -- the objects behind the engine (this process) ---------------------------------------------
    @property
    def worker(self):
        """The worker object (tp 1: it lives in this process); with tp > 1 use `collective_rpc`."""
        if self.tp > 1:
            raise RuntimeError(f"VllmLab.worker: with tp={self.tp} the workers are processes of their own; reach "
                               f"them with lab.llm.collective_rpc('nwor_report') and friends (worker.py)")
        return self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker

    @property
    def runtime(self):
        """The worker's NworRuntime (None without the plugin's settings; tp 1 only, see `worker`)."""
        return getattr(self.worker.model_runner, "nwor", None)

    def set_mode(self, nwor_mode: str | None = None, scv_mode: str | None = None) -> None:
        self.llm.collective_rpc("nwor_set_active", args=(True,))
        self.llm.collective_rpc("nwor_set_mode", args=(nwor_mode, scv_mode))
        self._stood_down = False

    def set_check(self, check: bool) -> None:
        """Compare vLLM's cache bytes with the invariants after every window (every rank, its shard)."""
        self.llm.collective_rpc("nwor_set_check", args=(check,))

    def stand_down(self) -> None:
        """Until the next `set_mode`: the plugin defers to vLLM's own code (vLLM alone, same engine)."""
        self.llm.collective_rpc("nwor_set_active", args=(False,))
        self._stood_down = True

    # -- generation -------------------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, seed: int | None = 0,
                 nwor_mode: str | None = None, scv_mode: str | None = None,
                 stop_at_eos: bool = False) -> VllmResult:
        """Every prompt to `max_new_tokens` (unless `stop_at_eos`); `seed` seeds request i with
        seed + i at temperature > 0 (None: unseeded)."""
        from vllm import SamplingParams

        from nwor_lab.config import check_int, check_temperature
        from nwor_lab.engine.generate import acceptance_stats

        check_int("max_new_tokens", max_new_tokens, 1)
        temperature = check_temperature("temperature", temperature)
        if isinstance(prompts, str):
            raise TypeError("prompts: expected a list of prompts; for one prompt pass [prompt]")
        if nwor_mode or scv_mode:
            if not self.plugin:
                raise ValueError("nwor_mode/scv_mode: this engine runs without the plugin (plugin=False)")
            self.set_mode(nwor_mode, scv_mode)
        active = self.plugin and not self._stood_down      # stood down: vLLM alone on this engine
        params = [SamplingParams(temperature=temperature, max_tokens=max_new_tokens, ignore_eos=not stop_at_eos,
                                 seed=None if (seed is None or temperature == 0) else seed + i)
                  for i in range(len(prompts))]
        if active:
            self.llm.collective_rpc("nwor_reset")
        before = self._spec_counters()
        t0 = time.perf_counter()
        outs = self.llm.generate(list(prompts), params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        after = self._spec_counters()
        token_ids = [list(o.outputs[0].token_ids) for o in outs]
        texts = [o.outputs[0].text for o in outs]
        metrics = {name: _delta(after.get(name), before.get(name)) for name in after}
        per_rank = []
        if active:
            from nwor_lab.vllm.ranks import compare_traces, merge_totals
            reports = self.llm.collective_rpc("nwor_report")          # one per rank, in rank order
            compare_traces([r["trace"] for r in reports])            # the same acceptance on every rank
            totals = merge_totals([r["totals"] for r in reports])    # each window once
            trace, windows, mode = reports[0]["trace"], reports[0]["windows"], reports[0]["nwor_mode"]
            mean, by_pos = acceptance_stats(trace, max(self.k, 1))
            forwards = totals["steps"]
            per_rank = [{k: v for k, v in r.items() if k not in ("trace", "windows")} for r in reports]
        else:
            trace, windows, totals, mode = [], [], {}, None
            mean, by_pos, forwards = _stats_from_vllm(metrics, self.k)
        return VllmResult(texts, token_ids, trace, mean, by_pos, forwards, seconds, totals, windows, metrics, mode,
                          per_rank)

    def _spec_counters(self) -> dict:
        out = {}
        for m in self.llm.get_metrics():
            if m.name.startswith("vllm:spec_decode") or m.name == "vllm:iteration_tokens_total":
                out[m.name] = list(m.values) if hasattr(m, "values") else getattr(m, "value", None)
        return out

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()


def _delta(after, before):
    if isinstance(after, list):
        before = before or [0] * len(after)
        return [a - b for a, b in zip(after, before)]
    if after is None:
        return None
    return after - (before or 0)


def _stats_from_vllm(metrics: dict, k: int) -> tuple[float, list[float], int]:
    """Without the plugin: the same two statistics from vLLM's counters (drafts, accepted, per position)."""
    drafts = metrics.get("vllm:spec_decode_num_drafts") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * k
    mean = (accepted + drafts) / drafts if drafts else 1.0
    return mean, [a / drafts if drafts else 0.0 for a in per_pos], 0
