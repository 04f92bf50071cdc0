"""Every state strategy on the same hybrid model and prompts, through the engine:
`nwor-lab bench state --json`.

    nwor-lab bench state --json                         CPU: the shipped hybrid pair when it is shipped
                                                        (nwor_lab.model.shipped.HYBRID_DIR), else a toy hybrid
    nwor-lab bench state --model 8b-hybrid --device cuda --batch 1 8 32 64 --k 4 --out state_8b.json
                                                        an 8B-class Qwen3-Next-like hybrid (3 gated DeltaNet
                                                        layers to 1 attention layer), random bf16 weights,
                                                        forced acceptance (as `bench engine --model 8b`)
    nwor-lab bench state --model 8b-hybrid-mini         the same code path at toy size (CPU tests)

One row per (batch, strategy) (`nwor_lab.state`: off, snapshots, cow, replay, stage; the K/V of the
attention layers under `stage` in every row, so only the state discipline differs):
  correct              greedy tokens equal to target-only's and, at T > 0 with one seed, tokens equal
                       to every other exact strategy's (`sampled_equal`; the reference is named in the
                       JSON). With forced acceptance (random weights) the drafts are accepted by a
                       profile, so the tokens are not target-only's by design: there `correct` means every
                       token the target emitted (one per window: after the accepted drafts) is the
                       target's own greedy choice after the emitted prefix, re-scored by one dense
                       forward over prompt + output (`max_logit_gap`: the largest shortfall of the
                       emitted token's logit below the best one, in units of that row's logit standard
                       deviation; above `tolerance` counts as a divergence: bf16 rounding differs
                       between a window and a dense pass). `tolerance` is the larger of `--tolerance`
                       and `target_only_max_logit_gap`, the largest gap of target-only decoding (k = 0)
                       through the same engine at the same batch, re-scored the same way: what bf16
                       arithmetic alone moves (at batch 32 on an H200 a prefill token, emitted before
                       any draft, was 0.29 from the dense pass); `greedy_equal` says whether the greedy tokens
                       equal the reference strategy's too (reported, not required)
  first_divergence     the earliest output token index where that fails (null when correct), and its prompt
  state_bytes_steady   per request, from the strategy's declaration (`steady_bytes_per_request`), checked
                       against the store the engine allocated (`state_bytes_steady_allocated`: store
                       bytes / slots)
  state_bytes_window   steady + the declared transient bytes while a window is open; beside it
                       `state_bytes_window_measured`: steady + the peak bytes the strategy actually held
                       for an open window (its `bytes_kept_peak` counter) per request of that window
  tokens_per_s, step_ms   median of `--repeats` timed runs (protocol of `bench engine`: a cold run, a
                       capture run where graphs are captured, the timed runs); step_ms = run seconds /
                       verify windows (the prefill's included)
  mean_acceptance_length, batch, k, device (the card's name on CUDA), torch
Timings are reported, never asserted.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time

import torch

from nwor_lab.bench.flags import add_engine_flags, parsed
from nwor_lab.bench.output import save_json
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.bench.timing import bench_device, device_name, free_device
from nwor_lab.state import STATE_POLICIES
from nwor_lab.engine.trace import first_divergence

MODELS = ("auto", "shipped", "toy", "8b-hybrid", "8b-hybrid-mini")
BLOCK = 16

# An 8B-class hybrid: Llama-3-8B's dimensions (hidden 4096, 32 layers, MLP 14336, 128k vocabulary)
# with Qwen3-Next's layout (every 4th layer full attention, the rest gated DeltaNet with 16 key
# heads, 32 value heads, K = V = 128, conv width 4): ~8.5 B parameters, ~17 GB in bf16; per request
# 24 x 2 MiB recurrent state + 24 x 48 KiB conv state in every store row.
HYBRID_SHAPES = {
    "8b-hybrid": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                      max_position_embeddings=8192, linear_num_key_heads=16, linear_num_value_heads=32,
                      linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4),
    "8b-hybrid-mini": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
                           max_position_embeddings=1024, linear_num_key_heads=2, linear_num_value_heads=4,
                           linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4),
}


# -- models ---------------------------------------------------------------------------------------
def random_hybrid(shape: str, device, dtype, seed: int = 0):
    """-> (HybridForCausalLM of `shape`, an EAGLE-1-shaped head) with random weights on `device`: the
    8B-shaped Llama's init (N(0, 0.02), nwor_lab.model.shapes), the conv at N(0, 0.5) and Qwen3-Next's
    decay spread (`init_decay`), so the recurrent state carries information from token to token."""
    from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
    from nwor_lab.model.shapes import _materialize, random_head
    cfg = HybridConfig(**HYBRID_SHAPES[shape])
    # CUDA: built on the meta device, allocated once in its dtype (no float32 copy of 17 GB); CPU (the
    # mini shape): built in place (the meta device's first use imports torch's decompositions: seconds)
    build = (lambda: torch.device("meta")) if torch.device(device).type == "cuda" else contextlib.nullcontext
    with build():
        target = HybridForCausalLM(cfg)
    gen = torch.Generator(device).manual_seed(seed)
    target = _materialize(target, device, dtype, gen)
    cpu = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in target.model.layers:
            if layer.layer_type == "linear_attention":
                w = layer.linear_attn.conv1d.weight
                w.normal_(0.0, 0.5, generator=gen)
                layer.linear_attn.init_decay(cpu)
                layer.linear_attn.norm.weight.fill_(1.0)
    return target, random_head(target, "eagle1", seed=seed + 1)


def toy_pair(wide: bool = False):
    """The toy hybrid of tests/test_engine_hybrid.py (3 gated DeltaNet : 1 attention, hidden 32,
    vocabulary 32) with an EAGLE-1 head whose fc passes the target's features through: some drafts
    accepted, some rejected. `wide`: hidden 64 and heads of 16 (attention and linear), the smallest
    the GPU kernels (Triton's tl.dot) take."""
    from nwor_lab.model.toy import toy_hybrid, toy_hybrid_head
    target = _wide_toy_hybrid(2) if wide else toy_hybrid(2)
    return target, toy_hybrid_head(target, 3)


@torch.no_grad()
def _wide_toy_hybrid(seed: int):
    """As nwor_lab.model.toy.toy_hybrid (its init), hidden 64, every head dimension 16."""
    from nwor_lab.model.hybrid import HybridConfig, HybridForCausalLM
    cfg = HybridConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    gen = torch.Generator().manual_seed(seed)
    model = HybridForCausalLM(cfg)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "conv1d" in name else 0.2))
    model.model.embed_tokens.weight.copy_(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen))
    for layer in model.model.layers:
        if layer.layer_type == "linear_attention":
            layer.linear_attn.init_decay(gen)
    return model.eval()


def shipped_dir():
    """The shipped hybrid pair's folder, or None while it is not shipped."""
    from nwor_lab.model import shipped
    d = getattr(shipped, "HYBRID_DIR", None)
    return d if d is not None and d.is_dir() else None


def load_model(name: str, device, dtype):
    """-> (model name, target, head, prompts source: ('text', tokenizer) or ('random', vocab), forced)."""
    if name == "auto":
        name = "shipped" if shipped_dir() is not None else "toy"
    if name == "shipped":
        d = shipped_dir()
        if d is None:
            raise UsageError("--model shipped: no hybrid pair is shipped yet (nwor_lab.model.shipped.HYBRID_DIR); "
                             "use --model toy")
        from nwor_lab.model.shipped import load_tiny
        target, head, tok = load_tiny(device=device, dtype=dtype, directory=d)
        return f"shipped hybrid ({d.name})", target, head, ("text", tok), False
    if name == "toy":
        target, head = toy_pair()
        return "toy hybrid (tests/test_engine_hybrid.py)", target.to(device, dtype), head.to(device, dtype), \
            ("random", target.config.vocab_size), False
    target, head = random_hybrid(name, device, dtype)
    return name, target, head, ("random", target.config.vocab_size), True


def make_prompts(source, n: int, length: int, seed: int = 7) -> list[list[int]]:
    kind, what = source
    if kind == "text":
        from nwor_lab.bench.engine import held_out_stream, prompts_from
        return prompts_from(held_out_stream(what), n, length, seed)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, what, (n, length), generator=gen).tolist()


# -- one engine ------------------------------------------------------------------------------------
def build_engine(target, head, strategy: str, k: int, batch: int, prompt_len: int, new_tokens: int, *,
                 temperature: float, seed: int, acceptance, graphs: bool, attention: str, scv: str = "graph"):
    from nwor_lab.config import LabConfig
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.buffers import token_bucket
    per = -(-(prompt_len + new_tokens + k + 1) // BLOCK)
    tokens = token_bucket(batch * max(prompt_len, k + 1) + prompt_len)
    cfg = LabConfig(nwor_mode="stage", state_mode=strategy, scv_mode=scv, attention=attention, cuda_graph=graphs)
    return SpecEngine(target, head if k else None, cfg, k=k, num_blocks=per * (batch + 1) + 1, block_size=BLOCK,
                      max_num_seqs=batch, max_num_batched_tokens=tokens, temperature=temperature, seed=seed,
                      acceptance=acceptance if k else None)


def run_once(engine, prompts, new_tokens: int):
    """-> (outputs per prompt, this run's verify-window trace)."""
    from nwor_lab.bench.timing import run_prompts
    first = len(engine.trace)
    reqs = run_prompts(engine, prompts, new_tokens)
    return [list(r.output) for r in reqs], [reqs[i].req_id for i in range(len(reqs))], engine.trace[first:]


def target_positions(trace, req_ids) -> dict[int, list[int]]:
    """Output indices of the tokens the target emitted itself (one per verify window that was not
    cut: the token after the accepted drafts), per request id."""
    out = {r: [] for r in req_ids}
    emitted = {r: 0 for r in req_ids}
    for w in trace:
        if w.kind != "verify":
            continue
        for rid, a, toks in zip(w.req_ids, w.accepted, w.emitted):
            if rid not in out:
                continue
            if len(toks) == a + 1:
                out[rid].append(emitted[rid] + a)
            emitted[rid] += len(toks)
    return out


@torch.no_grad()
def rescore(target, prompts, outputs, positions, chunk: int = 8):
    """The target's own tokens against one dense forward over prompt + output -> per prompt the
    largest shortfall of each target-emitted token's logit below the best logit at its row, in units
    of that row's logit standard deviation (0: the greedy choice), as a list over its positions."""
    dev = next(target.parameters()).device
    gaps = []
    for s in range(0, len(prompts), chunk):
        ids = [p + o for p, o in zip(prompts[s:s + chunk], outputs[s:s + chunk])]
        n = max(len(x) for x in ids)
        batch = torch.tensor([x + [0] * (n - len(x)) for x in ids], device=dev)
        hidden = target.forward_dense(batch)
        for j, (p, pos) in enumerate(zip(prompts[s:s + chunk], positions[s:s + chunk])):
            rows = torch.tensor([len(p) - 1 + i for i in pos], dtype=torch.long, device=dev)
            if not len(pos):
                gaps.append([])
                continue
            logits = target.compute_logits(hidden[j, rows]).float()
            chosen = torch.tensor([outputs[s + j][i] for i in pos], device=dev)
            gap = (logits.max(-1).values - logits.gather(1, chosen[:, None]).squeeze(1)) / logits.std(-1)
            gaps.append(gap.tolist())
        del hidden
    return gaps


def state_bytes(engine, k: int, batch: int) -> dict:
    """Declared (the strategy's class methods) and allocated / measured bytes per request."""
    pol = engine.states
    spec, store = pol.store.spec, pol.store
    steady = type(pol).steady_bytes_per_request(k, spec)
    window = steady + type(pol).transient_bytes_per_request(k, spec)
    allocated = store.nbytes // store.num_slots
    measured = allocated + pol.stats["bytes_kept_peak"] // max(1, batch)
    return {"state_bytes_steady": steady, "state_bytes_window": window,
            "state_bytes_steady_allocated": allocated, "state_bytes_steady_checked": allocated == steady,
            "state_bytes_window_measured": measured, "rows_per_slot": store.rows_per_slot}


def time_runs(engine, prompts, new_tokens: int, repeats: int, device) -> dict:
    """`bench engine`'s protocol after its cold run: one untimed run that captures each bucket's CUDA
    graph (when the engine captures), then `repeats` timed runs -> times, their median, the last
    run's requests and the timed runs' trace."""
    import numpy as np

    from nwor_lab.bench.timing import run_prompts, timed
    if engine.runner.capture:
        run_prompts(engine, prompts, new_tokens)
    first, times, reqs = len(engine.trace), [], []
    for _ in range(repeats):
        reqs, t = timed(lambda: run_prompts(engine, prompts, new_tokens), device)
        times.append(t)
    return dict(times=times, seconds=float(np.median(times)), requests=reqs, trace=engine.trace[first:])


# -- the bench -------------------------------------------------------------------------------------
def bench_batch(target, head, model: str, source, forced: bool, batch: int, args, device, acceptance) -> list[dict]:
    """Target-only, then every strategy at `batch` -> one row per strategy."""
    from nwor_lab.engine.generate import acceptance_stats
    k = args.k
    prompts = make_prompts(source, batch, args.prompt_len)
    common = dict(graphs=not args.no_cuda_graph, attention=args.attention, scv=args.scv)
    ref, floor = None, 0.0
    if forced:
        # the noise floor: target-only decoding (k = 0) through the same engine at the same batch,
        # re-scored the same way. Every token there is the target's own choice, so its largest gap is
        # how far bf16 arithmetic alone (batched prefill, window and decode shapes against one dense
        # pass) moves a correct token; a strategy counts as diverging only beyond it
        eng = build_engine(target, head, "stage", 0, batch, args.prompt_len, args.new_tokens, temperature=0.0,
                           seed=0, acceptance=None, **common)
        out0, _, _ = run_once(eng, prompts, args.new_tokens)
        del eng
        free_device(device)
        floor = max((x for g in rescore(target, prompts, out0, [list(range(len(o))) for o in out0]) for x in g),
                    default=0.0)
    if not forced:                 # the reference: target-only greedy decoding
        eng = build_engine(target, head, "stage", 0, batch, args.prompt_len, args.new_tokens, temperature=0.0,
                           seed=0, acceptance=None, **common)
        ref = run_once(eng, prompts, args.new_tokens)[0]
        del eng
        free_device(device)
    rows, greedy, sampled = [], {}, {}
    for name in args.strategies:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        eng = build_engine(target, head, name, k, batch, args.prompt_len, args.new_tokens, temperature=0.0, seed=0,
                           acceptance=acceptance, **common)
        out, req_ids, trace = run_once(eng, prompts, args.new_tokens)     # the cold run: correctness
        run = time_runs(eng, prompts, args.new_tokens, args.repeats, device)
        ntok = sum(len(r.output) for r in run["requests"])
        windows = sum(1 for t in run["trace"] if t.kind == "verify") // args.repeats
        mean, _ = acceptance_stats(run["trace"], max(k, 1))
        row = {"strategy": name, "model": model, "batch": batch, "k": k,
               "declared": {a: getattr(type(eng.states), a) for a in
                            ("advances_live", "keeps_window_states", "keeps_window_inputs", "checkpoints",
                             "commits_accepted_only")}}
        greedy[name] = out
        if forced:
            pos = target_positions(trace, req_ids)
            gaps = rescore(target, prompts, out, [pos[r] for r in req_ids])
            tol = max(args.tolerance, floor)
            bad = [(pos[req_ids[i]][j], i) for i, g in enumerate(gaps) for j, x in enumerate(g) if x > tol]
            div = min(bad) if bad else (None, None)
            row.update(correct_greedy=not bad, max_logit_gap=round(max((x for g in gaps for x in g), default=0.0), 4),
                       tolerance=round(tol, 4), tolerance_asked=args.tolerance,
                       target_only_max_logit_gap=round(floor, 4), target_tokens_checked=sum(len(g) for g in gaps),
                       target_tokens_over_tolerance=len(bad),
                       target_tokens_not_argmax=sum(1 for g in gaps for x in g if x > 0))
        else:
            d = first_divergence(out, ref, earliest=True)
            div = (None, None) if d is None else (d.token, d.prompt)
            row["correct_greedy"] = d is None
        row["first_divergence"], row["first_divergence_prompt"] = div
        row.update(state_bytes(eng, k, batch))
        row.update(tokens_per_s=round(ntok / run["seconds"], 2), step_ms=round(1e3 * run["seconds"] / max(1, windows), 3),
                   seconds=round(run["seconds"], 4), repeat_seconds=[round(t, 4) for t in run["times"]],
                   verify_windows_per_run=windows, mean_acceptance_length=round(mean, 3),
                   graphed_steps=eng.runner.graphed_steps, replayed_steps=eng.runner.replays,
                   cuda_graph_off=eng.graphed_off or eng.states.capture_off or None)
        if device.type == "cuda":
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        del eng, run
        free_device(device)                     # the captured graphs' pools too, before the next engine
        if args.temperature > 0:         # the same seed under every strategy: the same tokens
            eng = build_engine(target, head, name, k, batch, args.prompt_len, args.new_tokens,
                               temperature=args.temperature, seed=args.seed, acceptance=acceptance, **common)
            sampled[name] = run_once(eng, prompts, args.new_tokens)[0]
            del eng
            free_device(device)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    finish_rows(rows, greedy, sampled, forced, args.temperature)
    return rows


def finish_rows(rows, greedy: dict, sampled: dict, forced: bool, temperature: float) -> None:
    """Cross-strategy checks: the reference is the first exact strategy (`commits_accepted_only`) that
    is correct greedy, else the first exact one (so `greedy_equal` still says whether the exact
    strategies agree with each other); T > 0 (and, with forced acceptance, greedy) tokens must equal its."""
    exact = [r["strategy"] for r in rows if r["declared"]["commits_accepted_only"]]
    correct = [name for name in exact if next(r for r in rows if r["strategy"] == name)["correct_greedy"]]
    ref = (correct or exact or [None])[0]
    for r in rows:
        name = r["strategy"]
        r["reference_strategy"] = ref
        ok = r["correct_greedy"]
        if forced:      # reported, not required: fla's recompute (cow, replay) may round otherwise
            r["greedy_equal"] = ref is not None and greedy[name] == greedy[ref]
        if temperature > 0:
            r["sampled_equal"] = ref is not None and sampled[name] == sampled[ref]
            r["temperature"] = temperature
            if ref is not None and not r["sampled_equal"] and r["first_divergence"] is None:
                d = first_divergence(sampled[name], sampled[ref], earliest=True)
                r["first_divergence"], r["first_divergence_prompt"] = d.token, d.prompt
            ok = ok and r["sampled_equal"]
        r["correct"] = bool(ok)


def acceptance_text(text: str) -> str:
    """An argparse type: what `ForcedAcceptance.parse` reads (checked against k later)."""
    from nwor_lab.bench.engine8b import acceptance_text as check
    return check(text)


def parser() -> LabArgumentParser:
    p = LabArgumentParser(prog="nwor-lab bench state",
                          description="Every state strategy (off, snapshots, cow, replay, stage) on the same hybrid "
                                      "model and prompts, through the engine: correctness, state bytes, tokens/s, "
                                      "acceptance (JSON; the module docstring defines each field).")
    p.add_argument("--model", type=types.one_of(MODELS), default="auto",
                   help="auto: the shipped hybrid pair when shipped, else toy; 8b-hybrid (CUDA) / 8b-hybrid-mini: "
                        "random weights, forced acceptance")
    p.add_argument("--device", type=types.device, default=None, help="default: cuda for 8b-hybrid, else cpu")
    p.add_argument("--dtype", type=types.one_of(("auto", "float32", "bfloat16")), default="auto",
                   help="auto: bfloat16 for 8b-hybrid, float32 otherwise")
    p.add_argument("--batch", type=types.integer(1, 512), nargs="+", default=[2], help="batch sizes, e.g. --batch 1 8 32")
    p.add_argument("--k", type=types.integer(1, 15), default=3)
    p.add_argument("--strategies", type=types.listed(types.one_of(tuple(STATE_POLICIES)), "strategies"),
                   default=tuple(STATE_POLICIES))
    p.add_argument("--prompt-len", type=types.integer(1, 4096), default=None, help="default: 64 (8b-hybrid), else 6")
    p.add_argument("--new-tokens", type=types.integer(2, 4096), default=None, help="default: 64 (8b-hybrid), else 12")
    p.add_argument("--repeats", type=types.integer(1, 100), default=2)
    p.add_argument("--temperature", type=types.temperature, default=0.8,
                   help="the seeded T > 0 run (tokens identical across strategies); 0 skips it")
    p.add_argument("--seed", type=types.seed, default=0)
    p.add_argument("--acceptance", type=acceptance_text, default="shipped",
                   help="forced acceptance (random-weight models): 'shipped' (the shipped pair's profile), a rate "
                        "in [0, 1] or per-position rates")
    p.add_argument("--tolerance", type=types.number_in(0.0, 100.0), default=None,
                   help="forced acceptance: the largest logit shortfall still read as the greedy choice, in logit "
                        "standard deviations (default 0.25 in bf16: above its rounding between a window and a "
                        "dense pass; 1e-3 in float32)")
    add_engine_flags(p)
    p.add_argument("--json", action="store_true", help="print the JSON (always printed; kept for the documented command)")
    return p


def main(argv=None) -> dict:
    argv, args = parsed(parser(), argv)
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    big = args.model == "8b-hybrid"
    device = bench_device("state", args.device, args.model, default_cuda=big)
    dtype = getattr(torch, args.dtype if args.dtype != "auto" else ("bfloat16" if big else "float32"))
    args.prompt_len = args.prompt_len or (64 if big else 6)
    args.new_tokens = args.new_tokens or (64 if big else 12)
    if args.tolerance is None:
        args.tolerance = 1e-3 if dtype == torch.float32 else 0.25
    t_start = time.perf_counter()
    model, target, head, source, forced = load_model(args.model, device, dtype)
    try:
        acceptance = ForcedAcceptance.parse(args.acceptance, args.k) if forced else None
        if acceptance is not None:
            acceptance.for_k(args.k)
    except ValueError as err:
        raise UsageError(f"argument --acceptance: {err}") from None
    from nwor_lab.ops.gated_delta import fla_available
    rows = []
    out = {}
    for bs in args.batch:
        rows += bench_batch(target, head, model, source, forced, bs, args, device, acceptance)
        out = write(args, argv, device, dtype, model, forced, acceptance, t_start, rows,
                    fla_available(device), complete=bs == args.batch[-1])
    print(json.dumps(out, indent=1))
    return out


def write(args, argv, device, dtype, model, forced, acceptance, t_start, rows, fla: bool, complete: bool) -> dict:
    dev = device_name(device)
    for r in rows:
        r.setdefault("device", dev)
        r.setdefault("torch", torch.__version__)
    out = {"command": "nwor-lab bench state " + " ".join(argv), "device": dev, "torch": torch.__version__,
           "model": model, "dtype": str(dtype).replace("torch.", ""), "k": args.k, "batches": list(args.batch),
           "recurrence": "fla-core" if fla else "torch reference",
           "cuda_graph": not args.no_cuda_graph and device.type == "cuda", "scv": args.scv,
           "acceptance": ({"source": args.acceptance, **acceptance.describe(args.k)} if forced else "the target's"),
           "prompts": f"{args.prompt_len}-token prompts, {args.new_tokens} new tokens each, batch prompts together",
           "complete": complete, "seconds_total": round(time.perf_counter() - t_start, 1), "results": rows}
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
