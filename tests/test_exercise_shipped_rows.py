"""Exercise (u) shipped_rows (chapter 15): planted wrong answers are caught, in words and in a picture,
and the reference ships what the hand-off's own strategies export. (That it passes, says "not
attempted yet" for a stub and answers its prediction is checked for every exercise in tests/test_exercises.py.)"""
import pytest
import torch

from exercise_tools import caught
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def _mask(block_size, num_computed, target_layers, head_layers, rows, layers):
    P = -(-num_computed // block_size) * block_size
    out = torch.zeros(target_layers + head_layers, P, dtype=torch.bool)
    out[layers, :rows] = True
    return out


def whole_blocks_always(block_size, num_computed, target_layers, head_layers, strategy):
    P = -(-num_computed // block_size) * block_size
    L = target_layers + head_layers
    return _mask(block_size, num_computed, target_layers, head_layers, P,
                 slice(0, target_layers if strategy == "no_head" else L))


def drops_the_first_layer(block_size, num_computed, target_layers, head_layers, strategy):
    """no_head leaves layer 0 behind instead of the head's (the head's layers come last)."""
    out = solutions.shipped_rows(block_size, num_computed, target_layers, head_layers,
                                 "nwor" if strategy == "no_head" else strategy)
    if strategy == "no_head":
        out[:head_layers] = False
    return out


def ships_the_next_token(block_size, num_computed, target_layers, head_layers, strategy):
    """Counts position n (the next token: its K/V is not computed yet)."""
    out = solutions.shipped_rows(block_size, num_computed, target_layers, head_layers, strategy)
    if strategy != "write_all" and num_computed < out.shape[1]:
        out[:, num_computed] = out[:, 0]
    return out


def write_all_ships_committed_only(block_size, num_computed, target_layers, head_layers, strategy):
    return solutions.shipped_rows(block_size, num_computed, target_layers, head_layers,
                                  "nwor" if strategy == "write_all" else strategy)


@pytest.mark.parametrize("fn, note, words", [
    (whole_blocks_always, "the partial block's committed row only", "only write_all ships rows past n"),
    (drops_the_first_layer, "the head's layer (the last) left behind", "every strategy ships the target's"),
    (ships_the_next_token, "the partial block's committed row only", "past the committed length"),
    (write_all_ships_committed_only, "one row into a new block", "write_all ships it"),
])
def test_shipped_rows_checker_finds_the_usual_mistakes(fn, note, words):
    caught("shipped_rows", fn, note, words)


def test_shipped_rows_checker_names_a_wrong_dtype_and_shape():
    r = exercises.check("shipped_rows", lambda **kw: solutions.shipped_rows(**kw).int(), show=False)
    assert r.status == "fail" and "dtype" in r.message
    r = exercises.check("shipped_rows", lambda **kw: solutions.shipped_rows(**kw)[:, :kw["num_computed"]], show=False)
    assert r.status == "fail" and "shape" in r.message


@pytest.mark.parametrize("strategy", ["nwor", "write_all", "no_head"])
def test_the_reference_is_what_the_strategies_export(strategy):
    """The toy pair, prompts of 5, 9, 2 and 8 tokens prefilled under write-all: the layers and rows each
    shipment holds are the reference's mask (rows kept as zeros-or-not: shipped rows are the ones present)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.disagg import prefill
    from nwor_lab.engine import SpecEngine
    from nwor_lab.model.toy import toy_pair
    t, h = toy_pair(0)
    e = SpecEngine(t, h, LabConfig(nwor_mode="off"), k=3, num_blocks=64, block_size=4, max_num_seqs=4)
    g = torch.Generator().manual_seed(1)
    ps = [torch.randint(0, 16, (m,), generator=g).tolist() for m in (5, 9, 2, 8)]
    for s in prefill(e, ps, 8, strategy):
        n, L = s.header["num_computed"], s.header["cache_layers"]
        want = solutions.shipped_rows(4, n, t.num_layers, L - t.num_layers, strategy)
        got = torch.zeros_like(want)
        for layer in s.header["layers"]:
            got[layer, :s.tensors[f"key.{layer}"].shape[0]] = True
        assert torch.equal(got, want), (strategy, n)
