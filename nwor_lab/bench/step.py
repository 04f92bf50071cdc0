"""Step benchmark: what one whole engine step costs under each write policy, eager and replayed
from its CUDA graph, and how much of it is the KV path.

    nwor-lab bench step --json --out benchmarks/results/step_h100.json      (CUDA only)
    nwor-lab bench step --tp 1,2 ...          the engine at tp 1 vs 2 (nwor_lab.bench.tp)

The step is the engine's own (`nwor_lab.engine.step.run_step`, there is no other): verify forward
over t_last + k drafts per request (every layer writes its K/V through the policy; attention reads
the prefix from the paged cache and the window from the cache or the staging buffer) -> logits ->
rejection sampling with forced acceptance -> SCV -> head pass -> policy.commit -> the EAGLE draft
chain for the next window. `StepCase` builds a SpecEngine, prefills `batch` requests of `context`
tokens, steps until the decode bucket is captured, then times
    eager_us  the body on the engine's exact-size buffers (host work included)
    graph_us  the bucket's captured graph replayed (GPU time)
with CUDA events, round-robin over the policies; every timed call starts from the same inputs
(the step's buffers restored), so each repeats the same step.

Models: `shipped` (the tiny trained pair, float32) and `8b` (Llama-3-8B shape with random
weights and a random EAGLE-1 head: 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab
128256, bf16). Acceptance is forced (`ForcedAcceptance`, a constant conditional rate per draft
position): the sampler and SCV run on the real logits (their time counts), the verdict comes from
the rate, the same in every policy. `none` is the same step with a policy that writes nothing:
`kv_share = (t_mode - t_none) / t_mode`, from the same run.
"""
from __future__ import annotations

import itertools
import json
import sys
import time

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.bench.kernels import interleaved_time_us
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.engine.step import run_step
from nwor_lab.policies import WritePolicy
from nwor_lab.speculative.synthetic import ForcedAcceptance

BLOCK = 16


class NullPolicy(WritePolicy):
    """Writes nothing (the step without a KV path, for the KV share); the window is read from the
    cache, where stale rows sit: the same attention work as `off`."""

    name = "none"

    def _write(self, layer, key, value, token_offset) -> None:
        pass


def make_pair(name: str, device="cuda"):
    """-> (target, EAGLE-1 head) on `device`: the shipped pair (float32) or the 8B shape (bf16,
    random weights, `nwor_lab.model.shapes`)."""
    if name == "shipped":
        from nwor_lab.model.shipped import load_tiny
        target, head, _ = load_tiny(device=device)
        return target.eval(), head.eval()
    if name != "8b":
        raise ValueError(f"model={name!r}: choose shipped or 8b")
    from nwor_lab.model.shapes import random_head, random_target
    target = random_target("8b", device, torch.bfloat16)
    return target, random_head(target, "eagle1", "8b")


class StepCase:
    """One (pair, batch, k, context, policy) engine, prefilled and stepped until its decode bucket
    is captured (on CUDA with `graphs`); `eager()` and `replay()` run its step from the same inputs."""

    def __init__(self, pair, batch: int, k: int, context: int, mode: str, rate: float, attention: str = "auto",
                 graphs: bool = True, seed: int = 0, sliding_window: int = 0, kv_ring: str = "auto",
                 temperature: float = 0.0):
        from nwor_lab.engine import SpecEngine
        target, head = pair
        cfg = target.config
        per = -(-(context + 4 * k + 64) // BLOCK)
        policy = mode if mode != "none" else "off"
        # capture_at_start off: the case captures the one decode bucket it times (below), not every bucket
        config = LabConfig(nwor_mode=policy, scv_mode="graph", attention=attention, validate=False, cuda_graph=graphs,
                           sliding_window=sliding_window, kv_ring=kv_ring, capture_at_start=False)
        self.engine = e = SpecEngine(target, head, config, k=k, num_blocks=per * batch + 2, block_size=BLOCK,
                                     max_num_seqs=batch, max_num_batched_tokens=batch * (context + 1) + 1,
                                     acceptance=ForcedAcceptance((rate,) * k) if k else None,
                                     temperature=temperature)
        if mode == "none":
            e.policy = NullPolicy(e.cache, config, e.metrics, records=False)
        g = torch.Generator().manual_seed(seed)
        prompts = torch.randint(0, cfg.vocab_size, (batch, context), generator=g).tolist()
        self.requests = [e.add_request(p, 2 * k + 40) for p in prompts]
        e.runner.prelaunch = False       # the host state stays the step's: the buffers hold the next step
        e.step()                                            # the prefill (eager, exact sizes)
        self.inputs = None
        for _ in range(3):                                  # warm-up, capture (CUDA), replay
            e.step()
            buckets = [b for b in e.runner.buckets.values() if b.feeds_itself]
            if buckets and (buckets[0].graph is not None or not e.runner.capture):
                self.inputs = buckets[0]
                break
        for p in (e.policy, e.drafter.policy):
            p.records = False          # timed calls run the body alone: no host records
        self.exact = e.runner._inputs(self.requests, static=False)
        self.exact.fill(e, self.requests)
        self.saved = [(self.exact, _snapshot(self.exact))]
        if self.inputs is not None:
            self.saved.append((self.inputs, _snapshot(self.inputs)))

    def eager(self):
        """The engine's step body on the exact-size buffers, from the saved inputs."""
        _restore(*self.saved[0])
        return run_step(self.engine, self.exact)

    def replay(self):
        """The bucket's captured step replayed, from the saved inputs (GPU time)."""
        _restore(*self.saved[1])
        self.inputs.graph.replay()

    def accepted(self) -> int:
        """Drafts accepted in one eager step from the saved inputs."""
        packed = self.eager()[0]
        return int(packed[:len(self.requests), self.engine.k + 1].sum())


def _snapshot(inp):
    return [dev.clone() for dev, _ in inp.inputs._groups]


def _restore(inp, saved) -> None:
    for (dev, _), s in zip(inp.inputs._groups, saved):
        dev.copy_(s)


def measure(pair, batch: int, k: int, context: int, rate: float, attention: str, *, graphs: bool = True,
            iters: int = 3, reps: int = 11, temperature: float = 0.0) -> dict:
    """Eager and graphed µs per step for `none` and every write policy, measured round-robin (host
    drift hits every mode alike), with ratios to `off` and the KV share."""
    cases = {m: StepCase(pair, batch, k, context, m, rate, attention, graphs, temperature=temperature)
             for m in ("none",) + nwor_modes()}
    kinds = {"eager_us": interleaved_time_us({n: c.eager for n, c in cases.items()}, iters=iters, reps=reps)}
    if graphs and all(c.inputs is not None and c.inputs.graph is not None for c in cases.values()):
        kinds["graph_us"] = interleaved_time_us({n: c.replay for n, c in cases.items()}, iters=iters, reps=reps)
    out = {"rate": rate, "accepted": cases["off"].accepted(), "drafts": k * batch,
           "tokens": cases["off"].exact.tokens}
    for name in cases:
        out[name] = {kind: round(t[name], 1) for kind, t in kinds.items()}
    for kind in kinds:
        for mode in nwor_modes():
            out[mode][kind.replace("_us", "_vs_off")] = round(out[mode][kind] / out["off"][kind], 4)
            out[mode][kind.replace("_us", "_kv_share")] = round(1 - out["none"][kind] / out[mode][kind], 4)
    del cases
    return out


def run(models=("shipped", "8b"), batches=(1, 16, 64), ks=(2, 4, 8), rates=(0.2, 0.5, 0.8),
        context: int = 1024, attention: str = "auto", graphs: bool = True, command: str = "",
        temperature: float = 0.0) -> dict:
    results = []
    for name in models:
        pair = make_pair(name)
        for batch, k, rate in itertools.product(batches, ks, rates):
            with torch.no_grad():
                row = measure(pair, batch, k, context, rate, attention, graphs=graphs, temperature=temperature)
            row.update(model=name, batch=batch, k=k, context=context, temperature=temperature)
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)   # progress: nothing lost on a crash
            torch.cuda.empty_cache()
        del pair
        torch.cuda.empty_cache()
    from nwor_lab.model.attention import use_kernel
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "attention": "triton" if use_kernel(attention, torch.device("cuda")) else "torch",
            "step": "nwor_lab.engine.step.run_step (verify, sampler, SCV, head pass, commit, draft chain)",
            "temperature": temperature, "command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "block_size": BLOCK, "results": results}


@torch.no_grad()
def profile_one(model: str, batch: int, k: int, rate: float, context: int, attention: str, mode: str) -> int:
    """One warm eager step of `mode` inside the profiler range (what ncu measures DRAM bytes of)."""
    case = StepCase(make_pair(model), batch, k, context, mode, rate, attention)
    case.eager(), case.eager()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    case.eager()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(json.dumps({"profiled": mode, "model": model, "batch": batch, "k": k, "rate": rate,
                      "tokens": case.exact.tokens}))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--tp" or a.startswith("--tp=") for a in argv):   # tp 1 vs 2: the engine across ranks
        from nwor_lab.bench.tp import main as tp_main
        return tp_main(argv)
    p = LabArgumentParser(prog="nwor-lab bench step", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=types.output_file, help="also write the JSON here")
    p.add_argument("--models", type=types.listed(types.one_of(("shipped", "8b")), "models"), default=("shipped", "8b"),
                   help="comma separated: shipped, 8b")
    p.add_argument("--batches", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 16, 64))
    p.add_argument("--ks", type=types.listed(types.integer(1, 64), "draft counts"), default=(2, 4, 8))
    p.add_argument("--rates", type=types.listed(types.fraction, "rates in 0..1"), default=(0.2, 0.5, 0.8),
                   help="forced acceptance rates")
    p.add_argument("--context", type=types.integer(1, 1 << 20), default=1024, help="cached tokens per request")
    p.add_argument("--attention", default="auto", choices=["auto", "triton", "torch"])
    p.add_argument("--no-graphs", action="store_true", help="eager only")
    p.add_argument("--temperature", type=types.temperature, default=0.0,
                   help="sampling temperature of every engine (0: greedy; > 0 samples in the step, captured too)")
    p.add_argument("--profile", metavar="MODE", choices=nwor_modes(),
                   help="run one eager step of MODE (a write policy) of the first "
                   "model/batch/k/rate between cudaProfilerStart/Stop, for ncu --profile-from-start off")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UsageError("bench step: needs a CUDA device (none is visible here); run it on a GPU machine")
    if args.profile:
        return profile_one(args.models[0], args.batches[0], args.ks[0], args.rates[0], args.context,
                           args.attention, args.profile)
    result = run(args.models, args.batches, args.ks, args.rates, args.context, args.attention,
                 not args.no_graphs, "nwor-lab bench step " + " ".join(argv), temperature=args.temperature)
    text = save_json(result, args.out)
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
