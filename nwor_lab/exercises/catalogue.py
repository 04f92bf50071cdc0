"""Every exercise in one table: its letter, its name (the module, the reference in `solutions` and
the learner's function share it), what the learner writes in a few words, and the chapter it lives
in (file stem); there is no (q). An exercise module declares only what is its own (cases,
comparison, picture, hints, prediction); `Exercise` reads the rest from here by name, so a letter or
a chapter is written once."""
from __future__ import annotations

CATALOGUE = (
    # letter, name, title, chapter
    ("(a)", "slot_mapping", "the slot mapping", "12_exercises"),
    ("(b)", "acceptance_mask", "the SCV acceptance mask", "04_scv"),
    ("(c)", "stage_commit_rows", "the stage commit's rows", "12_exercises"),
    ("(d)", "cow_restore", "the CoW restore, bit for bit", "12_exercises"),
    ("(e)", "ring_evictions", "what a write-all window evicts on a ring", "07_sliding_window"),
    ("(f)", "storage_offsets", "where each KV head lives in memory (NHD / HND)", "02_paged_cache"),
    ("(g)", "spec_decode_indices", "SpecDecodeMetadata's index vectors", "03_verify_window"),
    ("(h)", "greedy_sampled_ids", "the greedy rejection sampler's output", "03_verify_window"),
    ("(i)", "window_attention_mask", "which staged rows each query reads", "05_stage"),
    ("(j)", "cow_restore_plan", "the CoW restore plan and its bytes", "06_cow"),
    ("(k)", "acceptance_stats", "mean acceptance length and acceptance by position", "08_eagle"),
    ("(l)", "rejected_slots", "which slots hold rejected K/V after an `off` window", "00_tour"),
    ("(m)", "write_share", "the share of off's rows stage writes, from a trace", "01_why"),
    ("(n)", "napkin_speedup", "EAGLE's napkin speedup from measured components", "11_performance"),
    ("(o)", "vllm_key_offsets", "where a token's key lives in vLLM's CPU cache (keys transposed)", "09_vllm"),
    ("(p)", "sweep_medians", "a sweep's rows into the report's figure: medians over repeats", "10_sweep"),
    ("(r)", "state_commit", "the recurrent state to commit and the conv inputs to keep", "13_state"),
    ("(s)", "tree_commit_plan", "a tree window's accepted path and its commit's rows", "14_trees"),
    ("(t)", "prefix_blocks", "the blocks a window's commit registers in the prefix cache", "15_prefix"),
    ("(u)", "shipped_rows", "the rows a hand-off ships, per strategy", "15_prefix"),
    ("(v)", "window_key_rows", "where stage's verify attention reads each key of a request", "16_stage_read_path"),
    ("(w)", "sampled_verdict", "the accepted length and the next token's distribution at T > 0", "17_sampling"),
)

NAMES = tuple(name for _, name, _, _ in CATALOGUE)
ENTRIES = {name: (letter, title, chapter) for letter, name, title, chapter in CATALOGUE}
