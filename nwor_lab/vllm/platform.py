"""vLLM's CPU platform with one more step: `additional_config["nwor_lab"]` alone switches NWOR on.

vLLM 0.32 picks an engine's worker class in the platform's `check_and_update_config`, which
`VllmConfig.__post_init__` calls in the process that builds the config, before any worker is
spawned (`CpuPlatform` turns `worker_cls="auto"` into its `CPUWorker`; every worker process then
builds the class the config names, `WorkerWrapperBase.init_worker`). A general plugin runs too
early to see the config, and the attention backend too late (the worker and its runner exist by
then). So the plugin ships a platform (the `vllm.platform_plugins` entry point), as vLLM's own
`ZenCpuPlatform` is a `CpuPlatform` subclass: for an engine with the `"nwor_lab"` key it sets the
plugin's worker class where vLLM would have set its own; for any other engine it is vLLM's
`CpuPlatform`, step for step.
"""
from __future__ import annotations

import logging

from vllm.platforms.cpu import CpuPlatform

from nwor_lab.vllm.names import LOGGER, VLLM_CPU_WORKER_CLS, WORKER_CLS

log = logging.getLogger(LOGGER)


class NworCpuPlatform(CpuPlatform):

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        super().check_and_update_config(vllm_config)
        select_worker(vllm_config)


def select_worker(vllm_config) -> bool:
    """For an engine configured for the plugin: its settings checked (a bad value refused here,
    in one line) and vLLM's CPU worker replaced by the plugin's. A worker class the user chose is
    kept; its workers refuse to start unless it is the plugin's (`plugin.require_worker`).
    True when the plugin's worker class was set here."""
    from nwor_lab.vllm.settings import NworSettings

    settings = NworSettings.from_vllm_config(vllm_config)
    if settings is None:
        return False
    parallel = vllm_config.parallel_config
    if parallel.worker_cls in ("auto", VLLM_CPU_WORKER_CLS):
        parallel.worker_cls = WORKER_CLS
        log.info("nwor_lab.vllm: additional_config['nwor_lab'] -> worker_cls %s (%s)", WORKER_CLS,
                 settings.describe())
        return True
    return False
