"""The worker class that installs the runner hooks (`worker_cls="nwor_lab.vllm.worker.NworCPUWorker"`,
which the plugin's platform sets by itself for an engine with `additional_config["nwor_lab"]`).

vLLM 0.32's `CPUWorker.init_device` constructs `CPUModelRunner` itself; rather than copy that
method, the worker gives the runner object it built the hooks of `NworRunnerMixin` (a subclass
made once: `NworCPUModelRunner`) and, after the KV cache exists, the runtime. With no
`additional_config["nwor_lab"]` the worker is vLLM's `CPUWorker` and the runner vLLM's runner.

Under tensor parallelism each rank's worker runs its own runtime (its shard of KV heads); the
`nwor_totals` RPC answers the engine's totals, each window once (ranks.py), on every rank.
"""
from __future__ import annotations

import logging

from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from nwor_lab.vllm.names import LOGGER
from nwor_lab.vllm.backend import NworCPUAttentionBackendImpl
from nwor_lab.vllm.guards import check_version
from nwor_lab.vllm.ranks import merge_totals
from nwor_lab.vllm.runtime import NworRuntime
from nwor_lab.vllm.settings import NworSettings
from nwor_lab.vllm.staging import enlarge_kv_cache_config, staging_blocks_needed

log = logging.getLogger(LOGGER)
SUPPORTED_METHODS = (None, "eagle", "eagle3", "ngram")


class NworRunnerMixin:
    """The three points of a step the runtime needs (see runtime.py): what was scheduled, what the
    rejection sampler returned, and the end of the step."""

    nwor: NworRuntime | None = None

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens_np):
        out = super()._prepare_inputs(scheduler_output, num_scheduled_tokens_np)
        if self.nwor is not None:
            self.nwor.plan(num_scheduled_tokens_np.tolist(), out[1], self.input_batch.req_ids)
        return out

    def _sample(self, logits, spec_decode_metadata):
        sampler_output = super()._sample(logits, spec_decode_metadata)
        if self.nwor is not None:
            self.nwor.accept(sampler_output.sampled_token_ids)
        return sampler_output

    def sample_tokens(self, grammar_output):
        try:
            return super().sample_tokens(grammar_output)
        finally:
            if self.nwor is not None:
                self.nwor.end_step()


class NworCPUModelRunner(NworRunnerMixin, CPUModelRunner):
    pass


class NworCPUWorker(CPUWorker):
    """vLLM's CPU worker plus the NWOR runtime when the engine is configured for it."""

    def __init__(self, vllm_config, *args, **kwargs):
        super().__init__(vllm_config, *args, **kwargs)
        self.nwor_settings = NworSettings.from_vllm_config(vllm_config)   # bad values: refused at start
        if self.nwor_settings is not None:
            check_version()
            spec = vllm_config.speculative_config
            method = getattr(spec, "method", None)
            if method not in SUPPORTED_METHODS:
                raise ValueError(f"nwor_lab.vllm: speculative method {method!r} is not supported by the plugin; "
                                 f"use one of eagle, eagle3, ngram (or no speculative_config)")
            pp = vllm_config.parallel_config.pipeline_parallel_size
            if pp > 1:
                # only the last stage samples: the earlier stages' windows would wait a step for their
                # acceptance (docs/vllm.md, chapter 09); not built
                raise ValueError(f"nwor_lab.vllm: pipeline_parallel_size={pp} is not supported by the plugin; use "
                                 f"tensor_parallel_size, or remove additional_config['nwor_lab']")

    def init_device(self):
        super().init_device()
        if self.nwor_settings is not None:
            if type(self.model_runner) is not CPUModelRunner:
                raise RuntimeError(f"nwor_lab.vllm: the worker built a {type(self.model_runner).__name__}; the plugin "
                                   f"hooks vLLM's V1 CPUModelRunner only")
            self.model_runner.__class__ = NworCPUModelRunner       # same object, the mixin's hooks added
            self.model_runner.nwor = NworRuntime(self.nwor_settings, self.model_runner, self._rank())

    def initialize_from_config(self, kv_cache_config) -> None:
        rt = getattr(self.model_runner, "nwor", None)
        staging = None
        if rt is not None:
            # stage's staging blocks (staging.py): the tensors get `extra` blocks past the pool's
            # count. A copy of the config: the engine's scheduler may hold the very same object.
            # The bytes are outside vLLM's KV budget, so at most 1/8 of the pool (a pass needing
            # more spares than that attends with the torch path instead)
            extra = min(self._staging_blocks(), max(1, kv_cache_config.num_blocks // 8))
            enlarged = enlarge_kv_cache_config(kv_cache_config, extra)
            if enlarged is None:
                log.info("nwor_lab.vllm: no staging blocks (unknown KV tensor placement); stage attends with "
                         "the lab's torch attention")
            else:
                staging = (kv_cache_config.num_blocks, extra)
                kv_cache_config = enlarged
        super().initialize_from_config(kv_cache_config)
        if staging is not None:
            self.cache_config.num_gpu_blocks = staging[0]     # the pool's count, not the tensors'
        if rt is not None:
            rt.attach_cache(staging)
            for mod in self.model_runner.compilation_config.static_forward_context.values():
                impl = getattr(mod, "impl", None)
                if isinstance(impl, NworCPUAttentionBackendImpl):
                    impl.nwor = rt

    def _staging_blocks(self) -> int:
        """Spare blocks for one pass of `max_num_seqs` requests, each staging at most k + 1 rows."""
        spec = self.vllm_config.speculative_config
        k = getattr(spec, "num_speculative_tokens", None) or 0
        block_size = self.vllm_config.cache_config.block_size
        return staging_blocks_needed(self.vllm_config.scheduler_config.max_num_seqs, k + 1, block_size)

    def _rank(self) -> dict:
        """This worker's place: vLLM's world rank, its rank in the tensor-parallel group, the group's size."""
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
        return {"rank": int(self.rank), "tp_rank": get_tensor_model_parallel_rank(),
                "tp_size": get_tensor_model_parallel_world_size()}

    # -- collective_rpc entry points (llm.collective_rpc("nwor_...")): every rank runs each ---------
    def nwor_set_mode(self, nwor_mode: str | None = None, scv_mode: str | None = None) -> str:
        rt = self._runtime()
        rt.set_mode(nwor_mode, scv_mode)
        return rt.config.nwor_mode

    def nwor_set_active(self, active: bool) -> bool:
        self._runtime_any().set_active(active)
        return active

    def nwor_set_check(self, check: bool) -> bool:
        self._runtime_any().check = bool(check)
        return bool(check)

    def nwor_totals(self, reset: bool = False) -> dict:
        """The engine's totals, each window once and bytes over every rank's shard (ranks.py), the
        same on every rank: the ranks exchange theirs (a collective: every rank runs this RPC)."""
        rt = self._runtime()
        mine = (rt.reset_totals() if reset else rt.totals).to_dict()
        return merge_totals(_gather(mine))

    def nwor_reset(self) -> bool:
        """Totals, trace and window rows afresh on this rank."""
        self._runtime_any().clear()
        return True

    def nwor_report(self) -> dict:
        """This rank's totals, trace and window rows since `nwor_reset` (`NworRuntime.report`)."""
        return self._runtime_any().report()

    def _runtime_any(self) -> NworRuntime:
        rt = getattr(self.model_runner, "nwor", None)
        if rt is None:
            raise RuntimeError("nwor_lab.vllm: this engine runs without the plugin's settings "
                               "(additional_config['nwor_lab'])")
        return rt

    def _runtime(self) -> NworRuntime:
        rt = getattr(self.model_runner, "nwor", None)
        if rt is None or not rt.active:
            raise RuntimeError("nwor_lab.vllm: this engine runs without the plugin's settings "
                               "(additional_config['nwor_lab'])")
        return rt


def _gather(obj) -> list:
    """`obj` from every rank of vLLM's world group, in rank order (no collective for one rank)."""
    from vllm.distributed import get_world_group
    group = get_world_group()
    if group.world_size == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * group.world_size
    dist.all_gather_object(out, obj, group=group.cpu_group)
    return out
