"""Hardening: nothing hangs, nothing diverges silently, every bad input gets one clear error.

One regression test per bug and guardrail, on the API (the toy pair: seconds on a CPU). The
command line's side of the same cases, and the check that nothing was changed, is in
tests/test_cli_errors.py. Every call that could hang runs under `deadline`.
"""
import io
import math

import numpy as np
import pytest
import torch

from fault_tools import deadline
from nwor_lab.config import KV_LAYOUTS, LabConfig, check_int, check_temperature
from nwor_lab.engine import SpecEngine, generate, prepare
from nwor_lab.kv import KVCacheSpec, KVLayout, PagedKVCache
from nwor_lab.kv.cache import CACHE_DTYPES
from nwor_lab.model.toy import toy_config, toy_pair

VOCAB = 16


@pytest.fixture(scope="module")
def pair():
    return toy_pair(0)


@pytest.fixture(scope="module")
def short_pair():
    """A toy pair whose model has 32 positions (context-length tests)."""
    return toy_pair(0, cfg=toy_config(max_position_embeddings=32))


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]


def gen(pair, prompts=None, **kw):
    target, head = pair
    kw = {"max_new_tokens": 8, "k": 3, "block_size": 4, **kw}
    return generate(PROMPTS if prompts is None else prompts, target=target, head=head, **kw)


# -- bugs ------------------------------------------------------------------------------------------
def test_max_num_seqs_zero_is_refused_instead_of_spinning(pair):
    with deadline(30), pytest.raises(ValueError, match=r"max_num_seqs=0: must be >= 1"):
        gen(pair, [[1, 2]], max_new_tokens=4, k=2, max_num_seqs=0)
    target, head = pair
    for name in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size"):
        with deadline(30), pytest.raises(ValueError, match=rf"{name}=0: must be >= 1"):
            SpecEngine(target, head, **{name: 0})


def test_a_scheduler_that_schedules_nothing_raises_instead_of_spinning(pair, monkeypatch):
    target, head = pair
    engine = SpecEngine(target, head, k=2, num_blocks=16, block_size=4)
    engine.add_request([1, 2], 4)
    monkeypatch.setattr(engine.scheduler, "schedule", lambda: [])
    with deadline(30), pytest.raises(RuntimeError, match="scheduled nothing"):
        engine.run()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.5])
def test_temperature_must_be_finite_and_not_negative(pair, bad):
    target, head = pair
    with pytest.raises(ValueError, match=r"temperature=.*finite number >= 0"):
        gen(pair, temperature=bad)
    with pytest.raises(ValueError, match=r"temperature="):
        SpecEngine(target, head, temperature=bad)


# -- guardrails: arguments -------------------------------------------------------------------------
def test_negative_k_is_an_error_not_target_only(pair):
    target, head = pair
    with pytest.raises(ValueError, match=r"k=-1: must be >= 0"):
        gen(pair, k=-1)
    with pytest.raises(ValueError, match=r"k=-1"):
        SpecEngine(target, None, k=-1)          # even where there is no head to draft with


def test_prompts_must_be_a_list(pair):
    target, head = pair
    with pytest.raises(TypeError, match=r"prompts: expected a list .* got str; for one prompt pass \[prompt\]"):
        generate("abc", target=target, head=head, tokenizer=object())
    with pytest.raises(TypeError, match="prompts: expected a list"):
        generate(torch.tensor([[1, 2]]), target=target, head=head)
    with pytest.raises(ValueError, match="prompts: the list is empty"):
        generate([], target=target, head=head)


def test_token_ids_are_integers_in_the_vocabulary(pair):
    with pytest.raises(TypeError, match=r"prompts\[1\]\[1\]=2.7: token ids are integers"):
        gen(pair, [[1, 2], [1, 2.7]])
    with pytest.raises(TypeError, match=r"prompts\[0\]\[0\]=True"):
        gen(pair, [[True, 2]])
    with pytest.raises(TypeError, match=r"prompts\[0\]: expected a 1-D integer tensor"):
        gen(pair, [torch.tensor([1.0, 2.0])])
    with pytest.raises(ValueError, match=r"prompts\[0\]\[2\]=16: token ids must be in 0..15"):
        gen(pair, [[1, 2, VOCAB]])
    with pytest.raises(ValueError, match=r"prompts\[0\]\[0\]=-1"):
        gen(pair, [[-1]])
    # numpy ints and integer tensors are token ids too, and give the same tokens
    ref = gen(pair, [[1, 2, 3]]).token_ids
    assert gen(pair, [np.array([1, 2, 3])[...].tolist()]).token_ids == ref
    assert gen(pair, [[np.int64(1), np.int32(2), 3]]).token_ids == ref
    assert gen(pair, [torch.tensor([1, 2, 3])]).token_ids == ref


def test_context_length_error_or_the_truncation_asked_for(short_pair):
    target, head = short_pair
    long = list(range(1, 16)) * 2                                    # 30 tokens, the model has 32
    with pytest.raises(ValueError, match=r"prompts\[0\]: 30 tokens \+ max_new_tokens=8 exceed the model's 32 "
                                         r"positions .*truncate_prompts=True to keep the prompt's last 24"):
        gen(short_pair, [long], max_new_tokens=8)
    with pytest.raises(ValueError, match=r"max_new_tokens=32: the model has 32 positions"):
        gen(short_pair, [[1]], max_new_tokens=32)
    cut = gen(short_pair, [long], max_new_tokens=8, truncate_prompts=True)
    assert cut.token_ids == gen(short_pair, [long[-24:]], max_new_tokens=8).token_ids
    engine = SpecEngine(target, head, k=2, num_blocks=32, block_size=4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.add_request(long, 8)
    assert not engine.scheduler.has_work                             # nothing was queued
    assert engine.add_request(long, 8, truncate=True).prompt == long[-24:]


def test_cache_size_is_checked_before_allocating(pair):
    target, head = pair
    with deadline(30), pytest.raises(MemoryError, match=r"the KV cache needs .* more than the .* available"):
        SpecEngine(target, head, num_blocks=10 ** 10)                 # petabytes: refused, not attempted
    with pytest.raises(MemoryError, match=r"more than max_cache_memory=1.0 KiB; lower num_blocks"):
        gen(pair, max_cache_memory=1024)
    spec = KVCacheSpec(2, 8, 4, 2, 16)
    assert spec.nbytes == 2 * 8 * 4 * 2 * 2 * 16 * 4
    with pytest.raises(MemoryError, match="max_cache_memory"):
        PagedKVCache(spec, max_bytes=spec.nbytes - 1)
    PagedKVCache(spec, max_bytes=spec.nbytes)


def test_running_requests_respect_max_num_batched_tokens(pair):
    """A budget of 6 with k=4 and three running requests: windows used to hold 10+ tokens."""
    sizes = []

    class WindowSizes:
        def on_phase(self, event):
            if event.phase == "begin" and event.kind == "verify":      # scheduled rows (not padding)
                sizes.append(int((event.window.slot_mapping >= 0).sum()))

    kw = {"max_new_tokens": 12, "max_num_seqs": 3, "block_size": 4}
    with deadline(60):
        small = gen(pair, k=4, max_num_batched_tokens=6, observers=[WindowSizes()], **kw)
    assert max(sizes) <= 6 and len(sizes) > 3
    assert small.token_ids == gen(pair, k=0, **kw).token_ids        # drafts cut to the budget: still exact
    assert any(n for w in small.trace if w.kind == "verify" for n in w.drafted)
    with deadline(60):                                               # budget 1: one token per window
        assert gen(pair, k=4, max_num_batched_tokens=1, prompts=[[1], [2]], **kw).token_ids == \
            gen(pair, k=0, prompts=[[1], [2]], **kw).token_ids


def test_backend_cuda_is_refused_where_it_would_be_ignored(pair):
    target, head = pair
    with pytest.raises(ValueError, match=r"backend='cuda' .*needs a CUDA device, but this runs on cpu"):
        SpecEngine(target, head, LabConfig(backend="cuda"))
    with pytest.raises(ValueError, match=r"LabConfig.backend='gpu' \(from NWOR_LAB_BACKEND\): choose one of auto"):
        LabConfig.from_env(environ={"NWOR_LAB_BACKEND": "gpu"})
    with pytest.raises(ValueError, match="NWOR_LAB_DEBUG='maybe'"):
        LabConfig.from_env(environ={"NWOR_LAB_DEBUG": "maybe"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_without_cuda_is_named_before_loading_anything():
    with pytest.raises(ValueError, match=r"device='cuda': CUDA is not available .*; use device=cpu"):
        generate(["def f"], device="cuda")
    with pytest.raises(ValueError, match=r"device='gpu': not a torch device"):
        generate(["def f"], device="gpu")


def test_numpy_integers_are_layer_indices():
    cache = PagedKVCache(KVCacheSpec(np.int64(3), 4, 4, 2, 8))
    assert cache.spec.num_layers == 3 and type(cache.spec.num_layers) is int
    assert cache.layer(np.int64(2))[0].data_ptr() == cache.layer(2)[0].data_ptr()
    cache.set_scales(np.int32(1), 0.5)
    with pytest.raises(TypeError, match=r"layer=1.0: expected an integer layer index, got float"):
        cache.layer(1.0)
    with pytest.raises(IndexError, match=r"layer=3: this cache has layers 0..2"):
        cache.layer(np.int64(3))


def test_layout_error_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"KVCacheSpec.layout='XYZ': choose one of NHD, HND"):
        KVCacheSpec(1, 1, 1, 1, 2, layout="XYZ")
    from nwor_lab.kv.layout import CACHE_LAYOUTS
    assert tuple(layout.value for layout in CACHE_LAYOUTS) == KV_LAYOUTS      # the CLI's choices
    assert tuple(CACHE_DTYPES) == ("auto", "fp8_e4m3", "fp8_e5m2")


def test_scalar_checks():
    assert check_int("n", np.int64(3), 1) == 3
    with pytest.raises(TypeError, match=r"n=2.0: expected an integer, got float"):
        check_int("n", 2.0)
    with pytest.raises(TypeError, match="got bool"):
        check_int("n", True)
    assert check_temperature("t", "0.5") == 0.5
    with pytest.raises(ValueError, match="t=nan"):
        check_temperature("t", float("nan"))


def test_sampled_rows_check_names_the_sampled_ids():
    from nwor_lab._checks import check_index, check_sampled_rows
    with pytest.raises(ValueError, match=r"sampled_token_ids: has 3 rows but the window has 2 requests"):
        check_sampled_rows(torch.zeros(3, 4, dtype=torch.int64), 2)
    assert check_index("token_offset", np.int64(2), 0, 4) == 2
    with pytest.raises(TypeError, match=r"token_offset=2.0: expected an integer"):
        check_index("token_offset", 2.0, 0, 4)


def test_scv_wrong_sampled_rows_blame_the_sampled_ids():
    from nwor_lab.speculative import ScvRunner
    from nwor_lab.window import Window
    window = Window.from_counts([3], [2], torch.tensor([0, 1, 2]), draft_token_ids=torch.tensor([5, 6]))
    with pytest.raises(ValueError, match=r"^sampled_token_ids"):
        ScvRunner("off").accept(window, torch.tensor([[5, 6, 7], [1, -1, -1]]))


def test_numpy_token_offset():
    """A numpy integer offset (what indexing an array gives) places each chunk at its window rows."""
    from nwor_lab.policies import make_policy
    from nwor_lab.window import Window
    cache = PagedKVCache(KVCacheSpec(1, 4, 4, 2, 8))
    policy = make_policy(LabConfig(), cache)
    policy.begin(Window.from_counts([2], [0], torch.tensor([5, 2])))          # row 0 -> slot 5, row 1 -> slot 2
    key, value = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    for row in np.arange(2):                                                   # np.int64 offsets, one row each
        policy.write(0, key[row:row + 1], value[row:row + 1], token_offset=row)
    policy.commit(None)
    k_cache, v_cache = cache.layer(0)                                          # [NB, BS, H, D], BS = 4
    assert torch.equal(k_cache[1, 1], key[0]) and torch.equal(v_cache[1, 1], value[0])
    assert torch.equal(k_cache[0, 2], key[1]) and torch.equal(v_cache[0, 2], value[1])


# -- checkpoints -----------------------------------------------------------------------------------
@pytest.fixture
def tiny_copy(tmp_path):
    import shutil

    from nwor_lab.model.shipped import TINY_DIR
    d = tmp_path / "tiny"
    shutil.copytree(TINY_DIR, d)
    return d


@pytest.mark.parametrize("name,damage,match", [
    ("model.safetensors", b"\x00\x01garbage", r"model.safetensors: not a readable safetensors file"),
    ("eagle.safetensors", None, r"eagle.safetensors: not a readable safetensors file"),
    ("config.json", b"{not json", r"config.json: cannot be read as JSON"),
    ("tokenizer.json", b"{bad", r"tokenizer.json: not a readable tokenizer.json"),
])
def test_a_corrupt_checkpoint_file_is_named(tiny_copy, name, damage, match):
    from nwor_lab.model.loader import CheckpointError
    from nwor_lab.model.shipped import load_tiny
    path = tiny_copy / name
    path.write_bytes(damage if damage is not None else path.read_bytes()[:3000])    # garbage or truncated
    with pytest.raises(CheckpointError, match=match) as err:
        load_tiny(directory=tiny_copy)
    assert str(tiny_copy) in str(err.value)


def test_a_missing_checkpoint_is_named(tmp_path):
    from nwor_lab.model.loader import CheckpointError
    from nwor_lab.model.shipped import load_tiny
    with pytest.raises(CheckpointError, match=r"nope: no such checkpoint directory"):
        load_tiny(directory=tmp_path / "nope")


# -- stepping, streaming and interrupts ------------------------------------------------------------
def test_a_generation_steps_and_reports_partial_results(pair):
    target, head = pair
    g = prepare(PROMPTS, 8, 3, target=target, head=head, block_size=4)
    assert g.step() and not g.done
    partial = g.result()
    assert not partial.complete and partial.summary()["complete"] is False
    assert all(len(o) <= 8 for o in partial.token_ids)
    assert g.run().result().token_ids == gen(pair).token_ids and g.result().complete
    assert g.step() is False


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_an_interrupt_mid_window_leaves_a_consistent_engine(pair, mode):
    """Ctrl-C inside a verify window: the policy cancels it, nothing is emitted for it; stepping on
    afterwards gives exactly the tokens of an uninterrupted run (greedy)."""
    target, head = pair

    class CtrlC:
        writes = 0

        def on_phase(self, event):
            if event.phase == "write" and event.kind == "verify":
                self.writes += 1
                if self.writes == 7:
                    raise KeyboardInterrupt

    cfg = LabConfig(nwor_mode=mode, debug=True)
    g = prepare(PROMPTS, 8, 3, cfg, target=target, head=head, block_size=4, observers=[CtrlC()])
    with deadline(60), pytest.raises(KeyboardInterrupt):
        g.run()
    assert g.engine.policy.window is None and g.engine.drafter.policy.window is None
    before = g.result()
    assert not before.complete
    g.run()
    assert g.result().token_ids == gen(pair, config=cfg).token_ids


def test_text_stream_prints_prompts_in_order_as_tokens_arrive(pair):
    from nwor_lab.cli.generate import TextStream
    from nwor_lab.commandline.generate_flags import SEPARATOR
    target, head = pair

    class Letters:                                          # a tokenizer: id t -> one letter
        @staticmethod
        def decode(ids):
            return "".join(chr(ord("a") + t) for t in ids)

    out = io.StringIO()
    g = prepare(PROMPTS[:2], 8, 3, target=target, head=head, block_size=4, max_num_seqs=2)
    stream = TextStream(["P0:", "P1:"], Letters(), out)
    stream.start(g.requests)
    seen = []
    while g.step():
        stream.flush()
        seen.append(out.getvalue())
    stream.flush(final=True)
    texts = g.result().token_ids
    want = "".join(f"P{i}:" + Letters.decode(t) + "\n" + SEPARATOR + "\n" for i, t in enumerate(texts))
    assert out.getvalue() == want
    assert len(set(seen)) > 2                                # it grew window by window
    assert all(want.startswith(s) for s in seen)


def test_text_stream_holds_back_half_a_character():
    from nwor_lab.cli.generate import TextStream

    class Req:
        finished = False
        output = [1]

    class Bytes:
        @staticmethod
        def decode(ids):
            return "ok" + ("\ufffd" if len(ids) == 1 else "é")

    out = io.StringIO()
    stream = TextStream([">"], Bytes(), out)
    req = Req()
    stream.start([req])
    stream.flush()
    assert out.getvalue() == ">ok"
    req.output, req.finished = [1, 2], True
    stream.flush()
    assert out.getvalue().startswith(">oké\n")
