"""Benchmark (not a test): the engine end to end on a Llama-3-8B-shaped target with random weights,
with an EAGLE-1-shaped and an EAGLE-3-shaped head, drafts accepted by a forced profile.

    nwor-lab bench engine --model 8b --device cuda --out benchmarks/results/engine8b_h100.json
    nwor-lab bench engine --model 8b-mini --device cpu      (the same code path at toy size)

What runs (`nwor_lab.model.shapes`): the 8B target (bf16, ~16 GB), the heads (EAGLE-1: the target's
128k LM head; EAGLE-3: its own 32k draft vocabulary), the engine as it serves (steady steps and
steps with prefills replayed from CUDA graphs, the draft chain in the same graph, pre-launch).
Acceptance is forced (`nwor_lab.speculative.synthetic`, vLLM's synthetic mode): draft j is accepted
with the profile's conditional rate, whatever the random target thinks, so the EAGLE rows do the
work a trained pair at that acceptance does (`--acceptance`: `shipped`, the shipped pair's
measured profile, mean acceptance length 3.35 at k = 4; a constant rate; or per-position rates).
Tokens are random ids: meaningless, and different from target-only's by design.

Per batch size: target-only, then every head x k x write policy (SCV `--scv`), each on its own
engine with the protocol of `bench engine` (a cold run, a capturing run, `--repeats` timed runs,
median). Prompts: `--prompt-len` random ids; at batch 1 two prompts one after the other, else
`batch` prompts together. Requests joining a running batch are `nwor-lab bench serve`'s: arrivals
in wall-clock time (Poisson, or closed-loop clients). This bench's `--arrivals staggered` spaced
arrivals in engine steps, so configs whose steps last differently (EAGLE vs target-only) saw
different workloads in time: it is gone (its stored runs, `engine8b_staggered_*.json`, compared
mixed steps replayed from graphs against the same steps eager, within one config).

Rows: tokens/s end to end, and `decode_tokens_per_s` without the prefill (a run of the same
prompts for one token, timed alike, subtracted: `prefill_seconds`), each one's speedup over
target-only; the mean acceptance length measured and expected; the step counts of each kind.
`components`: the napkin math's inputs measured on this GPU as CUDA-graph replays (attention
included): a target decode step (1 token a request), a verify step (1 + k), one head pass (1 row
a request, its LM head included), and `napkin_speedup` = L x decode / (verify_k + k x head pass)
beside each EAGLE row. `hf_generate`: Hugging Face `generate` on the same random weights.
Chosen for ~8 minutes on one H100: 64-token prompts, 64 new tokens, 2 timed repeats.
"""
from __future__ import annotations

import json
import time

import torch

from nwor_lab.bench.flags import add_engine_flags, parsed
from nwor_lab.bench.output import save_json
from nwor_lab.bench.timing import bench_device, device_name, free_device, run_prompts, time_engines_interleaved, timed
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.engine.generate import acceptance_stats
from nwor_lab.engine.buffers import token_bucket
from nwor_lab.model.shapes import HEAD_SHAPES, SHAPES, parameter_bytes, random_head, random_target
from nwor_lab.speculative.synthetic import ForcedAcceptance, mean_acceptance_length

BLOCK = 16


def prompts_for(batch: int, length: int, vocab: int, staggered: bool, seed: int = 7) -> list[list[int]]:
    n = 2 * batch if staggered else (2 if batch == 1 else batch)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def build_engine(target, head, k: int, mode: str, scv: str, batch: int, prompt_len: int, new_tokens: int,
                 acceptance, attention: str, graphs: bool, temperature: float = 0.0, seed: int = 0,
                 ride_dead: bool = True):
    from nwor_lab.engine import SpecEngine
    per = -(-(prompt_len + new_tokens + k + 1) // BLOCK)
    # the largest step: every request's prompt at once, or a prompt joining batch - 1 decodes
    tokens = token_bucket(batch * max(prompt_len, k + 1) + prompt_len)
    cfg = LabConfig(nwor_mode=mode, scv_mode=scv, attention=attention, cuda_graph=graphs, ride_dead=ride_dead)
    return SpecEngine(target, head if k else None, cfg, k=k, num_blocks=per * (batch + 1) + 1, block_size=BLOCK,
                      max_num_seqs=batch, max_num_batched_tokens=tokens, acceptance=acceptance if k else None,
                      temperature=temperature, seed=seed)


def measure(engine, prompts, new_tokens: int, repeats: int, device, gap: int) -> dict:
    return measure_interleaved({"": engine}, prompts, new_tokens, repeats, device, gap)[""]


def measure_interleaved(engines: dict, prompts, new_tokens: int, repeats: int, device, gap: int = 0) -> dict:
    """`measure` over {name: engine}, their timed runs in turn (timing.time_engines_interleaved)."""
    runs = time_engines_interleaved(engines, prompts, new_tokens, repeats, device, arrival_gap=gap)
    for name, engine in engines.items():
        # the same prompts for one token each: the prefill steps alone (same buckets, same graphs)
        pre = [timed(lambda: time_prefill(engine, prompts, gap), device)[1] for _ in range(2)]
        runs[name]["prefill_seconds"] = min(pre)
    return runs


def time_prefill(engine, prompts, gap: int) -> None:
    run_prompts(engine, prompts, 1, gap)


def engine_row(engine, run, batch: int, config: str, head: str | None, k: int, mode: str, scv: str,
               acceptance, gap: int, mixed: bool, device) -> dict:
    reqs = run["requests"]
    ntok = sum(len(r.output) for r in reqs)
    secs = run["seconds"]
    decode_secs = max(secs - run["prefill_seconds"], 1e-9)
    mean, by_pos = acceptance_stats(run["trace"], max(k, 1))
    g = engine.runner
    reps = max(1, len(run["times"]))
    steps = sum(1 for t in run["trace"] if t.kind == "verify") // reps
    decode_steps = sum(1 for t in run["trace"] if t.kind == "verify" and "prefill" not in t.kinds) // reps
    row = {"batch_size": batch, "config": config, "head": head, "k": k, "nwor": mode, "scv": scv,
           "arrivals": f"staggered every {gap} steps" if gap else "together", "mixed_graphs": mixed,
           "requests": len(reqs), "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(ntok / secs, 2),
           "prefill_seconds": round(run["prefill_seconds"], 4),
           "decode_tokens_per_s": round((ntok - len(reqs)) / decode_secs, 2),
           "cold_seconds": round(run["cold"], 4), "repeat_seconds": [round(t, 4) for t in run["times"]],
           "target_forwards": run["forwards"], "verify_windows_per_run": steps,
           "decode_windows_per_run": decode_steps,
           "decode_step_ms": round(1e3 * decode_secs / max(1, decode_steps), 3),
           "ms_per_target_forward": round(1e3 * secs / max(1, run["forwards"]), 3),
           "graphed_steps": g.graphed_steps, "chained_steps": g.graphed_steps if engine.drafting else 0,
           "prelaunched_steps": g.prelaunched, "mixed_steps": g.mixed_steps, "prefill_steps": g.prefill_steps,
           "graphs_at_start": list(g.startup_capture) if g.startup_capture else None,   # (graphs, seconds)
           "mean_acceptance_length": round(mean, 3) if k else None,
           "acceptance_by_position": [round(a, 3) for a in by_pos] if k else None,
           "expected_mean_acceptance_length": round(mean_acceptance_length(acceptance.for_k(k)), 3) if k else None}
    if device.type == "cuda":
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return row


# -- the napkin math's inputs -----------------------------------------------------------------
@torch.no_grad()
def component_times(target, heads: dict, batch: int, ks, context: int, attention: str, device) -> dict:
    """ms per CUDA-graph replay (attention included, over `context` cached tokens a request): a
    target decode step (logits of every row), a verify step of 1 + k tokens a request, and one
    head pass of one row a request (a chain step: the head's layer and its LM head)."""
    from nwor_lab.bench.kernels import time_us
    from nwor_lab.kv import KVCacheSpec, PagedKVCache
    from nwor_lab.model.attention import AttentionMetadata
    from nwor_lab.ops.graphs import capture_graph
    cfg = target.config
    t_max = 1 + max(ks)
    per = -(-(context + t_max) // BLOCK)
    cache = PagedKVCache(KVCacheSpec(cfg.num_hidden_layers + 1, batch * per + 1, BLOCK, cfg.num_key_value_heads,
                                     cfg.head_dim, dtype=next(target.parameters()).dtype), device)
    tables = [list(range(1 + r * per, 1 + (r + 1) * per)) for r in range(batch)]
    gen = torch.Generator(device).manual_seed(0)

    def md_for(t: int):
        pos = [context + j for _ in range(batch) for j in range(t)]
        return AttentionMetadata.build(cache, None, pos, [t] * batch, tables, [context] * batch, attention=attention)

    def timed_graph(fn) -> float:
        fn()
        graph = capture_graph(fn, device=device)
        ms = time_us(graph.replay, iters=3, reps=7, warmup=1) / 1e3
        del graph
        return round(ms, 3)

    out = {"batch": batch, "context": context, "graphed": device.type == "cuda"}
    for t in [1] + [1 + k for k in ks]:
        md = md_for(t)
        ids = torch.randint(0, cfg.vocab_size, (batch * t,), device=device, generator=gen)
        fn = lambda ids=ids, md=md: target.compute_logits(target(ids, md)).argmax(-1)  # noqa: E731
        out["decode_ms" if t == 1 else f"verify_k{t - 1}_ms"] = timed_graph(fn) if device.type == "cuda" else \
            _cpu_ms(fn)
    md = md_for(1)
    for name, head in heads.items():
        ids = torch.randint(0, cfg.vocab_size, (batch,), device=device, generator=gen)
        g = torch.randn(batch, cfg.hidden_size, device=device, generator=gen).to(cache.spec.dtype)
        fn = lambda head=head, ids=ids, g=g: head.compute_logits(head(ids, g, md)).argmax(-1)  # noqa: E731
        out[f"{name}_pass_ms"] = timed_graph(fn) if device.type == "cuda" else _cpu_ms(fn)
    del cache
    return out


def _cpu_ms(fn, reps: int = 3) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return round(1e3 * (time.perf_counter() - t0) / reps, 3)


def napkin(components: dict, head: str, k: int, length: float) -> dict:
    """Expected EAGLE speedup at acceptance length L: L tokens per (verify_k + k head passes) against
    one token per decode step (the chain: the head's pass in the verify window and k - 1 more)."""
    step = components[f"verify_k{k}_ms"] + k * components[f"{head}_pass_ms"]
    return {"napkin_step_ms": round(step, 3), "napkin_speedup": round(length * components["decode_ms"] / step, 3)}


# The napkin anchor measured on an H100: dense bf16 GEMMs of the 8B shape replayed as CUDA graphs,
# attention left out, batch 1 (decode 2.6 TB/s of weights); with L = 3.35 and k = 4 it gives
# EAGLE-1 2.42x and EAGLE-3 2.72x.
H100_ANCHOR = {"batch": 1, "decode_ms": 5.80, "verify_k4_ms": 5.85, "eagle1_pass_ms": 0.55, "eagle3_pass_ms": 0.32}


def compare(result: dict) -> list[dict]:
    """Per EAGLE row of a `bench engine --model 8b` result: the napkin speedup from this GPU's
    component times (expected and measured acceptance length) beside the measured ones, and where
    the time goes: the measured decode steps against the components they should cost."""
    comps = {c["batch"]: c for c in result.get("components", [])}
    base = {(r["batch_size"], r["arrivals"], r["mixed_graphs"]): r for r in result["results"] if not r["k"]}
    out = []
    for r in result["results"]:
        c, t = comps.get(r["batch_size"]), base.get((r["batch_size"], r["arrivals"], r["mixed_graphs"]))
        if not r["k"] or c is None or t is None or f"verify_k{r['k']}_ms" not in c:
            continue
        expected = napkin(c, r["head"], r["k"], r["expected_mean_acceptance_length"])
        measured_l = napkin(c, r["head"], r["k"], r["mean_acceptance_length"])
        out.append({
            "batch": r["batch_size"], "head": r["head"], "k": r["k"], "nwor": r["nwor"],
            "L_expected": r["expected_mean_acceptance_length"], "L_measured": r["mean_acceptance_length"],
            "napkin_speedup": expected["napkin_speedup"], "napkin_speedup_measured_L": measured_l["napkin_speedup"],
            "decode_speedup": r["decode_speedup_vs_target_only"], "end_to_end_speedup": r["speedup_vs_target_only"],
            # target-only: a replayed decode step against the bare forward (sampler, host, launch gaps)
            "target_step_ms": t["decode_step_ms"], "decode_ms": c["decode_ms"],
            # EAGLE: a replayed step (verify, head pass, sampler, SCV, commit, chain) against the napkin's
            "eagle_step_ms": r["decode_step_ms"], "napkin_step_ms": expected["napkin_step_ms"],
            "extra_step_ms": round(r["decode_step_ms"] - expected["napkin_step_ms"], 3)})
    return out


# -- Hugging Face generate on the same weights --------------------------------------------------
def hf_model(target):
    """A transformers LlamaForCausalLM holding the lab target's tensors (no copy when the meta
    build works; else a copy), or (None, reason)."""
    try:
        from transformers import LlamaConfig as HFConfig
        from transformers import LlamaForCausalLM as HFLlama
    except ImportError as err:
        return None, f"transformers not importable ({err})"
    c = target.config
    p = next(target.parameters())
    cfg = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                   num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                   num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                   rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings,
                   tie_word_embeddings=False, attention_bias=False)
    state = target.state_dict()
    try:
        with torch.device("meta"):
            hf = HFLlama(cfg)
        hf.load_state_dict(state, strict=False, assign=True)
        hf.model.rotary_emb = _rotary_like(hf.model.rotary_emb, cfg, p.device)
        if any(t.is_meta for t in list(hf.parameters()) + list(hf.buffers())):
            raise RuntimeError("tensors left on the meta device")
        how = "shares the lab target's tensors"
    except Exception as err:   # noqa: BLE001 - another transformers: build it on the device and copy
        prev = torch.get_default_dtype()
        torch.set_default_dtype(p.dtype)
        try:
            with torch.device(p.device):
                hf = HFLlama(cfg)
        finally:
            torch.set_default_dtype(prev)
        missing, unexpected = hf.load_state_dict(state, strict=False)
        if unexpected or any("rotary" not in m for m in missing):
            return None, f"weights do not map onto transformers' Llama (missing {missing[:3]}, unexpected {unexpected[:3]})"
        how = f"a copy of the lab target's weights (sharing failed: {type(err).__name__}: {err})"
    return hf.eval(), how


def _rotary_like(rotary, cfg, device):
    """transformers' rotary embedding module rebuilt off the meta device (its signature varies)."""
    for kwargs in (dict(config=cfg, device=device), dict(config=cfg)):
        try:
            return type(rotary)(**kwargs).to(device)
        except TypeError:
            continue
    raise RuntimeError(f"cannot rebuild {type(rotary).__name__} off the meta device")


@torch.no_grad()
def hf_rows(target, batches, prompt_len: int, new_tokens: int, device, repeats: int) -> list[dict]:
    hf, how = hf_model(target)
    if hf is None:
        return [{"config": "hf-generate greedy", "error": how}]
    rows = []
    for bs in batches:
        prompts = prompts_for(bs, prompt_len, target.config.vocab_size, False)
        groups = [prompts[i:i + 1] for i in range(2)] if bs == 1 else [prompts]

        def go(n=new_tokens):
            return [hf.generate(torch.tensor(g, device=device), attention_mask=torch.ones(len(g), prompt_len,
                                dtype=torch.long, device=device), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=0) for g in groups]
        go(4)
        runs = [timed(go, device) for _ in range(repeats)]
        secs = sorted(t for _, t in runs)[len(runs) // 2]
        ntok = sum((o.shape[1] - prompt_len) * o.shape[0] for o in runs[0][0])
        rows.append({"batch_size": bs, "config": "hf-generate greedy", "k": 0, "requests": len(prompts),
                     "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(ntok / secs, 2),
                     "repeat_seconds": [round(t, 4) for _, t in runs], "weights": how})
        print(json.dumps(rows[-1]), flush=True)
    del hf
    return rows


# -- the command --------------------------------------------------------------------------------
def acceptance_text(text: str) -> str:
    """An argparse type: `shipped`, a rate in [0, 1] or comma-separated rates (checked against k later)."""
    import argparse
    try:
        ForcedAcceptance.parse(text, 1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def parser() -> LabArgumentParser:
    p = LabArgumentParser(prog="nwor-lab bench engine --model 8b", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=types.one_of(tuple(SHAPES)), default="8b")
    p.add_argument("--device", type=types.device, default=None, help="default: cuda when present, else cpu")
    p.add_argument("--dtype", type=types.one_of(("bfloat16", "float16", "float32")), default="bfloat16")
    p.add_argument("--heads", type=types.listed(types.one_of(HEAD_SHAPES), "heads"), default=HEAD_SHAPES)
    p.add_argument("--ks", type=types.listed(types.integer(1, 16), "draft counts"), default=(2, 4, 6))
    p.add_argument("--batch-sizes", type=types.listed(types.integer(1, 256), "batch sizes"), default=(1, 8, 32))
    p.add_argument("--policies", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=nwor_modes())
    p.add_argument("--acceptance", type=acceptance_text, default="shipped",
                   help="'shipped' (the shipped pair's measured profile), a constant rate in [0, 1], or "
                        "per-position rates such as 0.9,0.7,0.5,0.3,0.2,0.1 (unconditional, non-increasing)")
    p.add_argument("--prompt-len", type=types.integer(1, 4096), default=64)
    p.add_argument("--new-tokens", type=types.integer(2, 4096), default=64)
    p.add_argument("--repeats", type=types.integer(1, 100), default=2)
    p.add_argument("--mixed-graphs", type=types.one_of(("on", "off", "both")), default="on",
                   help="replay steps with prefills from graphs (on), eagerly (off), or both for the comparison")
    add_engine_flags(p)
    p.add_argument("--temperature", type=types.temperature, default=0.0,
                   help="sampling temperature of every engine (0: greedy; forced acceptance still decides the drafts)")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate row")
    p.add_argument("--hf-repeats", type=types.integer(1, 100), default=1)
    p.add_argument("--no-components", action="store_true", help="skip the napkin math's measurements")
    return p


def main(argv=None) -> dict:
    argv, args = parsed(parser(), argv)
    device = bench_device("engine", args.device, args.model)
    try:
        acceptance = ForcedAcceptance.parse(args.acceptance, max(args.ks))
        for k in args.ks:
            acceptance.for_k(k)
    except ValueError as err:
        raise UsageError(f"argument --acceptance: {err}") from None
    dtype = getattr(torch, args.dtype)
    gap = 0                       # arrivals in engine steps are gone (module docstring): all together
    mixed_modes = {"on": [True], "off": [False], "both": [True, False]}
    graphs = not args.no_cuda_graph
    t_start = time.perf_counter()
    target = random_target(args.model, device, dtype)
    heads = {name: random_head(target, name, args.model) for name in args.heads}
    sizes = {"target_gib": round(parameter_bytes(target) / 2**30, 2),
             **{f"{n}_gib": round(parameter_bytes(h) / 2**30, 3) for n, h in heads.items()}}
    print(json.dumps({"model": args.model, **sizes}), flush=True)
    # the outside baseline first (Hugging Face generate, the same weights): it is in every file written
    hf = [] if args.no_hf else hf_rows(target, args.batch_sizes, args.prompt_len, args.new_tokens,
                                                    device, args.hf_repeats)
    rows, components = [], []
    for bs in args.batch_sizes:
        prompts = prompts_for(bs, args.prompt_len, target.config.vocab_size, False)
        if not args.no_components:
            c = component_times(target, heads, bs, args.ks, args.prompt_len + args.new_tokens // 2, args.attention,
                                device)
            components.append(c)
            print(json.dumps(c), flush=True)
        configs = [(None, 0, "off")] + [(h, k, m) for h in args.heads for k in args.ks for m in args.policies]
        for mixed in mixed_modes[args.mixed_graphs]:
            base = None
            for head, k, mode in configs:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                engine = build_engine(target, heads.get(head), k, mode, args.scv, bs, args.prompt_len,
                                      args.new_tokens, acceptance, args.attention, graphs, temperature=args.temperature)
                engine.runner.mixed = mixed
                run = measure(engine, prompts, args.new_tokens, args.repeats, device, gap)
                name = "target-only" if not k else f"{head} k={k} nwor={mode}"
                row = engine_row(engine, run, bs, name, head, k, mode, args.scv, acceptance, gap, mixed, device)
                if not k:
                    base = row
                row["speedup_vs_target_only"] = round(row["tokens_per_s"] / base["tokens_per_s"], 3)
                row["decode_speedup_vs_target_only"] = round(row["decode_tokens_per_s"] / base["decode_tokens_per_s"], 3)
                if k and components:
                    row.update(napkin(components[-1], head, k, row["expected_mean_acceptance_length"]))
                rows.append(row)
                print(json.dumps(row), flush=True)
                del engine, run
                free_device(device)
        if args.out:                       # what is measured so far survives a timeout
            write(args, argv, device, sizes, acceptance, gap, t_start, components, rows, hf, complete=False)
    return write(args, argv, device, sizes, acceptance, gap, t_start, components, rows, hf, complete=True)


def write(args, argv, device, sizes, acceptance, gap, t_start, components, rows, hf, complete: bool) -> dict:
    out = {"command": "nwor-lab bench engine " + " ".join(argv),
           "device": device_name(device),
           "torch": torch.__version__, "model": args.model, "dtype": args.dtype, "shape": SHAPES[args.model],
           "parameters": sizes, "attention": args.attention, "cuda_graph": not args.no_cuda_graph and device.type == "cuda",
           "temperature": args.temperature, "acceptance": {"source": args.acceptance, **acceptance.describe(max(args.ks))},
           "prompts": f"random ids: {args.prompt_len}-token prompts, {args.new_tokens} new tokens each"
                      + (f", 2 x batch requests arriving every {gap} steps" if gap else ""),
           "complete": complete, "seconds_total": round(time.perf_counter() - t_start, 1),
           "components": components, "results": rows, "hf_generate": hf}
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
