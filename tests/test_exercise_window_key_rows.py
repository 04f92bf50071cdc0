"""Exercise (v) window_key_rows (chapter 16): planted wrong answers are caught, in words and in a
picture, and the reference names the rows the lab's verify attention reads (its window source)."""
import pytest
import torch

from exercise_tools import caught
from nwor_lab import exercises
from nwor_lab.exercises import solutions


def no_indirection(cache_lens, win_rows, win_start, request):
    n, lo, hi = int(cache_lens[request]), int(win_start[request]), int(win_start[request + 1])
    return torch.tensor([-1] * n + list(range(lo, hi)), dtype=torch.int64)


def no_request_offset(cache_lens, win_rows, win_start, request):
    n, w = int(cache_lens[request]), int(win_start[request + 1] - win_start[request])
    return torch.tensor([-1] * n + win_rows[:w].tolist(), dtype=torch.int64)


def t_last_in_cache(cache_lens, win_rows, win_start, request):
    n, lo, hi = int(cache_lens[request]), int(win_start[request]), int(win_start[request + 1])
    return torch.tensor([-1] * (n + 1) + win_rows[lo + 1:hi].tolist(), dtype=torch.int64)


def window_only(cache_lens, win_rows, win_start, request):
    return win_rows[int(win_start[request]):int(win_start[request + 1])].long().clone()


def first_request_cache(cache_lens, win_rows, win_start, request):
    n, lo, hi = int(cache_lens[0]), int(win_start[request]), int(win_start[request + 1])
    return torch.tensor([-1] * n + win_rows[lo:hi].tolist(), dtype=torch.int64)


@pytest.mark.parametrize("fn, note", [
    (no_indirection, "shuffled staging rows"),
    (no_request_offset, "shuffled staging rows"),
    (t_last_in_cache, "shuffled staging rows"),
    (window_only, "shuffled staging rows"),
    (first_request_cache, "shuffled staging rows"),
])
def test_window_key_rows_checker_finds_the_usual_mistakes(fn, note):
    caught("window_key_rows", fn, note, "Request 1")


def test_window_key_rows_checker_names_a_wrong_dtype():
    r = exercises.check("window_key_rows", lambda **kw: solutions.window_key_rows(**kw).int(), show=False)
    assert r.status == "fail" and "int32" in r.message, r.message


def test_the_reference_names_the_rows_the_verify_attention_reads():
    """Poison every staging row the reference does not name for a request: the lab's attention (torch
    reference, window source) gives the same output for it, and poisoning a named row changes it."""
    from nwor_lab.ops.verify_attention import verify_attention_reference
    from nwor_lab.ops.verify_attention_cases import make_verify_attention_case
    case = make_verify_attention_case(num_reqs=3, query_lens=[2, 4, 1], context_lens=[5, 0, 9], window_extra=0,
                                      num_kv_heads=1, head_size=16, dtype=torch.float32, window=True, seed=3)
    kw = case.kwargs()
    base = verify_attention_reference(**kw)
    for r in range(3):
        rows = solutions.window_key_rows(case.cache_lens, case.win_rows.long(), case.win_start, r)
        named = set(rows[rows >= 0].tolist())
        q0, q1 = int(case.query_start_loc[r]), int(case.query_start_loc[r + 1])
        other = [i for i in range(case.win_key.shape[0]) if i not in named]
        wk = case.win_key.clone()
        wk[other] = 1e3
        assert torch.equal(verify_attention_reference(**{**kw, "win_key": wk})[q0:q1], base[q0:q1]), r
        wk = case.win_key.clone()
        wk[sorted(named)] = 1e3
        assert not torch.equal(verify_attention_reference(**{**kw, "win_key": wk})[q0:q1], base[q0:q1]), r
