"""Switching the plugin on: `additional_config["nwor_lab"]` alone (the plugin's platform sets the
worker class), bad values refused at engine start in one line naming the key, and an engine that
could not get the plugin's worker refused naming `worker_cls` (never silently inactive)."""
from types import SimpleNamespace

import pytest


def test_bad_mode_refused_at_engine_start():
    import os
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from nwor_lab.vllm.checkpoints import prepare
    dirs = prepare()
    with pytest.raises(Exception, match=r"LabConfig.nwor_mode='sometimes': choose one of off, cow, stage"):
        LLM(model=str(dirs["target"]), dtype="float32", block_size=32, kv_cache_memory_bytes=16 << 20,
            max_model_len=256, enforce_eager=True, distributed_executor_backend="uni",
            additional_config={"nwor_lab": {"nwor_mode": "sometimes"}})


def test_engine_kwargs_refuse_before_vllm_starts():
    from nwor_lab.vllm import engine_kwargs
    from nwor_lab.vllm.settings import SettingsError
    with pytest.raises(SettingsError, match="unknown key"):
        engine_kwargs(nwor_mod="stage")
    assert engine_kwargs(nwor_mode="cow") == {"additional_config": {"nwor_lab": {"nwor_mode": "cow"}}}


def test_vllm_runs_on_the_plugins_platform():
    """Where vLLM would pick its CpuPlatform, the plugin's subclass is picked (vllm.platform_plugins)."""
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    from nwor_lab.vllm import PLATFORM_CLS, platform_plugin
    assert platform_plugin() == PLATFORM_CLS
    assert type(current_platform).__name__ == "NworCpuPlatform" and isinstance(current_platform, CpuPlatform)
    assert current_platform.is_cpu()


def _config(worker_cls, extra):
    return SimpleNamespace(parallel_config=SimpleNamespace(worker_cls=worker_cls), additional_config=extra)


def test_the_platform_sets_the_worker_class_only_for_configured_engines():
    from nwor_lab.vllm import VLLM_CPU_WORKER_CLS, WORKER_CLS
    from nwor_lab.vllm.platform import select_worker
    for given in ("auto", VLLM_CPU_WORKER_CLS):
        cfg = _config(given, {"nwor_lab": {"nwor_mode": "stage"}})
        assert select_worker(cfg) and cfg.parallel_config.worker_cls == WORKER_CLS
    plain = _config(VLLM_CPU_WORKER_CLS, {})
    assert not select_worker(plain) and plain.parallel_config.worker_cls == VLLM_CPU_WORKER_CLS
    own = _config("my.Worker", {"nwor_lab": {}})              # a user's class is kept (and refused by the worker)
    assert not select_worker(own) and own.parallel_config.worker_cls == "my.Worker"


def test_a_configured_engine_without_the_plugins_worker_is_refused():
    """What an engine's attention layers check at start (VLLM_TARGET_DEVICE=cpu skips platform plugins)."""
    from nwor_lab.vllm import VLLM_CPU_WORKER_CLS, WORKER_CLS
    from nwor_lab.vllm.plugin import require_worker
    for bad in (VLLM_CPU_WORKER_CLS, "no.such.Worker"):
        with pytest.raises(RuntimeError, match=r"worker_cls is '[\w.]+', so NWOR would not run; pass worker_cls="):
            require_worker(_config(bad, {"nwor_lab": {}}))
    require_worker(_config(WORKER_CLS, {"nwor_lab": {}}))
