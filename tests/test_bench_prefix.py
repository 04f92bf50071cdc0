"""`nwor-lab bench prefix` at a tiny size (CPU, seconds): every field in the JSON, the exact
strategies' hit rate at target-only's, drop_last's lower, the missing head cache's acceptance after a
hit lower; the 8B shape's argument handling (it needs CUDA) and its toy-size path."""
import json

import pytest

from nwor_lab.bench import prefix
from nwor_lab.cli.main import main

TINY = ["--conversations", "3", "--turns", "1", "--system-tokens", "20", "--max-new-tokens", "6",
        "--block-size", "4", "--repeats", "1", "--quiet", "--policies", "stage"]
FIELDS = ("config", "head", "policy", "head_cache", "lookahead", "k", "hit_rate", "hit_tokens", "prompt_tokens",
          "hit_requests", "recomputed_tokens", "recomputed_prefix_tokens", "head_rows_recomputed", "evictions",
          "preemptions", "swapped_out_bytes", "swapped_in_bytes", "output_tokens", "acceptance_length",
          "acceptance_length_after_hit", "acceptance_length_same_requests_no_prefix", "tokens_per_s",
          "tokens_per_s_min", "tokens_per_s_max", "seconds_median", "ttft_ms", "tpot_ms", "tokens_equal_target_only")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "prefix.json"
    got = prefix.main([*TINY, "--heads", "eagle1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(got))
    return {r["config"]: r for r in got["results"]}, got


def test_every_field_and_the_workload_stated(result):
    rows, got = result
    assert got["complete"] and got["workload"]["system_tokens"] == 20 and got["workload"]["conversations"] == 3
    assert got["workload"]["seed"] == 0 and got["pruning"]
    for name, row in rows.items():
        if "refused" in row:
            assert "recompute" in name and "not built" in row["refused"]
            continue
        assert set(FIELDS) <= set(row), (name, set(FIELDS) - set(row))
        assert set(row["ttft_ms"]) == {"p50", "p90", "p99"} and row["tokens_equal_target_only"] is True


def test_hit_rates_and_acceptance_after_a_hit(result):
    rows, _ = result
    only = rows["target-only + prefix cache"]
    exact, drop = rows["eagle1 stage cached+boundary"], rows["eagle1 stage cached+drop_last"]
    missing = rows["eagle1 stage missing+boundary"]
    assert only["hit_rate"] > 0.5 and exact["hit_rate"] == only["hit_rate"] == missing["hit_rate"]
    assert drop["hit_rate"] < exact["hit_rate"] and drop["recomputed_prefix_tokens"] == 4 * drop["hit_requests"]
    assert missing["acceptance_length_after_hit"] < exact["acceptance_length_after_hit"]
    assert exact["acceptance_length_after_hit"] == exact["acceptance_length_same_requests_no_prefix"]
    assert rows["target-only"]["hit_rate"] == 0 and rows["eagle1"]["acceptance_length_after_hit"] is None


def test_8b_shape_arguments(capsys):
    assert main(["bench", "prefix", "--model", "8b", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert main(["bench", "prefix", "--policy", "cow", "--policies", "stage"]) == 2
    assert "--policy cow" in capsys.readouterr().err
    assert main(["bench", "prefix", "--model", "8b-mini", "--acceptance", "nope"]) == 2
    p = prefix.parser().parse_args(["--model", "8b"])
    prefix.resolve(p)
    assert (p.conversations, p.system_tokens, p.dtype) == (32, 512, "bfloat16")


def test_8b_mini_runs_the_forced_path():
    got = prefix.main(["--model", "8b-mini", "--heads", "eagle3", "--head-caches", "cached", "--lookaheads",
                       "boundary,drop_last", "--repeats", "1", "--quiet", "--policies", "stage"])
    rows = {r["config"]: r for r in got["results"]}
    assert got["acceptance"]["source"] == "shipped"
    assert rows["eagle3 stage cached+boundary"]["hit_rate"] == rows["target-only + prefix cache"]["hit_rate"] > 0
    assert rows["eagle3 stage cached+drop_last"]["hit_rate"] < rows["eagle3 stage cached+boundary"]["hit_rate"]
