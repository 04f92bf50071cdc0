"""Bad plugin settings are refused at engine start, in one line naming the key."""
import pytest


def test_bad_mode_refused_at_engine_start():
    import os
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from nwor_lab.vllm import WORKER_CLS
    from nwor_lab.vllm.checkpoints import prepare
    dirs = prepare()
    with pytest.raises(Exception, match=r"LabConfig.nwor_mode='sometimes': choose one of off, cow, stage"):
        LLM(model=str(dirs["target"]), dtype="float32", block_size=32, kv_cache_memory_bytes=16 << 20,
            max_model_len=256, enforce_eager=True, distributed_executor_backend="uni", worker_cls=WORKER_CLS,
            additional_config={"nwor_lab": {"nwor_mode": "sometimes"}})


def test_engine_kwargs_refuse_before_vllm_starts():
    from nwor_lab.vllm import engine_kwargs
    from nwor_lab.vllm.settings import SettingsError
    with pytest.raises(SettingsError, match="unknown key"):
        engine_kwargs(nwor_mod="stage")
    assert engine_kwargs(nwor_mode="cow")["additional_config"] == {"nwor_lab": {"nwor_mode": "cow"}}
