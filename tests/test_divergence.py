"""The one `first_divergence` (nwor_lab.engine.trace) every front end formats its own way: where two
runs' generated tokens first differ, by prompt or earliest over the prompts, and which window
emitted the token."""
from nwor_lab.engine.trace import Divergence, WindowTrace, first_divergence


def test_equal_runs_do_not_diverge():
    assert first_divergence([[1, 2, 3], []], [[1, 2, 3], []]) is None
    assert first_divergence([], []) is None


def test_the_first_prompt_that_differs_and_its_tokens():
    d = first_divergence([[1, 2], [3, 4, 5]], [[1, 2], [3, 9, 5]])
    assert d == Divergence(prompt=1, token=1, got=4, want=9) and d.where() == {"prompt": 1, "token": 1}


def test_a_run_that_stops_early_differs_at_the_shorter_length():
    assert first_divergence([[1, 2, 3]], [[1, 2]]) == Divergence(0, 2, got=3, want=None)
    assert first_divergence([[1]], [[1, 2]]) == Divergence(0, 1, got=None, want=2)


def test_earliest_takes_the_smallest_token_index_over_the_prompts():
    got, want = [[1, 2, 3, 4], [5, 6, 7], [8, 0]], [[1, 2, 3, 0], [5, 0, 7], [8, 9]]
    assert first_divergence(got, want).where() == {"prompt": 0, "token": 3}
    assert first_divergence(got, want, earliest=True).where() == {"prompt": 1, "token": 1}   # ties: the first


def test_the_window_that_emitted_it():
    trace = [WindowTrace(0, "verify", [7, 9], emitted=[[1], [5]]),
             WindowTrace(0, "draft", [7, 9], emitted=[[], []]),
             WindowTrace(1, "verify", [9], emitted=[[6, 0]]),
             WindowTrace(2, "verify", [7, 9], emitted=[[2, 3], [8]])]
    got, want = [[1, 2, 3], [5, 6, 0, 8]], [[1, 2, 3], [5, 6, 7, 8]]
    assert first_divergence(got, want, trace=trace, req_ids=[7, 9]) == Divergence(1, 2, got=0, want=7, window=1)
    assert first_divergence(got, want).window is None                      # no trace given
