"""ranks.py without an engine: each window counted once, ranks that disagree refused, the CPU
binding split per rank."""
import pytest

from nwor_lab.vllm.ranks import RankMismatch, merge_totals, omp_bind, summarize_records


def _totals(bytes_written, accepted=5, checks=3):
    return {"steps": 4, "verify_windows": 3, "drafts": 12, "accepted": accepted, "draft_windows": 3,
            "chain_rows": 9, "rejected_writes": 70, "rejected_left": 0, "checks_passed": checks,
            "bytes_written": bytes_written, "seconds_in_nwor": 0.1 * checks}


def test_merge_counts_windows_once_and_sums_the_shards_bytes():
    merged = merge_totals([_totals(100, checks=3), _totals(100, checks=2)])
    assert merged["accepted"] == 5 and merged["drafts"] == 12 and merged["rejected_writes"] == 70
    assert merged["bytes_written"] == 200 and merged["checks_passed"] == 2 and merged["ranks"] == 2
    assert merged["seconds_in_nwor"] == pytest.approx(0.3)
    assert merge_totals([_totals(100)])["bytes_written"] == 100
    with pytest.raises(RankMismatch, match="rank 1 counted accepted=6"):
        merge_totals([_totals(100), _totals(100, accepted=6)])


def _row(rank, step, accepted, kind="verify", nbytes=10):
    return {"rank": rank, "tp_rank": rank, "tp_size": 2, "vllm_step": step, "kind": kind, "num_drafts": 4,
            "num_accepted": accepted, "rejected_writes": 3, "rejected_left": 0, "bytes_written": nbytes}


def test_summary_of_a_two_rank_record_file():
    rows = [_row(0, 1, 2), _row(1, 1, 2), _row(1, 2, 4), _row(0, 2, 4), _row(0, 2, 0, kind="draft"),
            _row(1, 2, 0, kind="draft")]
    s = summarize_records(rows)
    assert (s["windows"], s["ranks"], s["verify_windows"], s["drafts"], s["accepted"]) == (3, 2, 2, 8, 6)
    assert s["rejected_writes"] == 9 and s["bytes_written"] == 60
    assert summarize_records([{k: v for k, v in r.items() if k != "rank"} for r in rows[:1]])["accepted"] == 2
    with pytest.raises(RankMismatch, match="rank 1 and rank 0"):
        summarize_records([_row(0, 1, 2), _row(1, 1, 3)])


def test_omp_bind_splits_the_cpus_per_rank():
    assert omp_bind(2, {0, 1}) == "0|1"
    assert omp_bind(2, range(16)) == "0-7|8-15"
    assert omp_bind(1, {3}) == "3"
    assert omp_bind(2, {0, 2, 5, 7}) == "0,2|5,7"
    with pytest.raises(ValueError, match="tp=3"):
        omp_bind(3, {0, 1})
