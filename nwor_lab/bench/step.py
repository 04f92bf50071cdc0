"""Verify-step benchmark: what one whole verify step costs under each write policy, eager and as
one CUDA graph, and how much of it is the KV path.

    nwor-lab bench step --json --out benchmarks/results/step_h100.json      (CUDA only)
    nwor-lab bench step --tp 1,2 ...          the engine at tp 1 vs 2 (nwor_lab.bench.tp)

One verify step, as the engine runs it:
    policy.begin(window) -> target forward over the window (every layer projects its K/V and
    writes them through the policy; attention reads the prefix from the paged cache and the window
    from the cache or the staging buffer) -> logits at the sampled rows -> greedy rejection
    sampling -> SCV mask -> policy.commit(acceptance)
timed with CUDA events (median of many), eager (host included) and captured once in a CUDA graph
and replayed (padded static shapes: the window's tensors are the graph's inputs).

Models: `shipped` (the tiny trained pair's target, float32) and `8b` (Llama-3-8B shape with random
weights: 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab 128256, bf16).
Every request has `--context` tokens in the cache and schedules t_last + k drafts.

Acceptance is forced: the sampler and SCV run on the real logits (their time counts), but the
policy commits `round(rate * k * R)` accepted drafts spread evenly over the requests, so each
configuration's commit/restore work is exactly the one named. `none` is the same step with a
writer that writes nothing: `kv_share = (t_mode - t_none) / t_mode` is the KV path's share of the
step, from the same run. Ratios cow/off and stage/off are from the same run too.
"""
from __future__ import annotations

import itertools
import json
import sys
import time

import torch

from nwor_lab.bench.kernels import interleaved_time_us
from nwor_lab import atomic
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import NWOR_MODES, LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.ops.scv import scv_mask
from nwor_lab.policies import make_policy
from nwor_lab.speculative import SpecDecodeMetadata, rejection_sample
from nwor_lab.window import Acceptance, Window

BLOCK = 16


class NullWriter:
    """Writes nothing (the step without a KV path, for the KV share); the window is read from the
    cache, where stale rows sit: the same attention work as `off`."""

    window_in_buffer = False

    def kv_destination(self, layer, token_offset, n):
        return None

    def write(self, layer, key, value, token_offset=0):
        pass

    def window_kv(self, layer):
        return None


def make_model(name: str, device="cuda"):
    """-> a LlamaForCausalLM on `device`: the shipped target (float32) or the 8B shape (bf16, random
    weights, `nwor_lab.model.shapes`: allocated once in bf16, RoPE frequencies real)."""
    if name == "shipped":
        from nwor_lab.model.shipped import load_tiny
        return load_tiny(device=device)[0].eval()
    if name != "8b":
        raise ValueError(f"model={name!r}: choose shipped or 8b")
    from nwor_lab.model.shapes import random_target
    return random_target("8b", device, torch.bfloat16)


class StepCase:
    """One (model, batch, k, context) verify window, built once; `step(writer)` runs it.

    sliding: a SlidingWindow (nwor_lab.kv.ring): every layer attends the last W positions and, with
    a ring, each request holds a ring of `ring_slots` slots. fill_from: another case of the same
    model, batch and context whose cache holds the K/V to use (its last `ring_slots` positions
    copied into this ring): the same logical context, so the two steps must agree.
    """

    def __init__(self, model, batch: int, k: int, context: int, attention: str, seed: int = 0, *,
                 sliding=None, fill_from: "StepCase | None" = None):
        cfg, dev = model.config, next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.model, self.batch, self.k, self.attention, self.sliding = model, batch, k, attention, sliding
        ring = sliding.ring_slots if sliding is not None else None
        g = torch.Generator().manual_seed(seed)
        per_req = -(-(context + k + 1) // BLOCK) if ring is None else -(-ring // BLOCK)
        blocks = torch.randperm(batch * per_req + 1, generator=g)[:batch * per_req].view(batch, per_req)
        self.tables = blocks.tolist()
        spec = KVCacheSpec(cfg.num_hidden_layers, batch * per_req + 1, BLOCK, cfg.num_key_value_heads,
                           cfg.head_dim, dtype=dtype)
        self.cache = PagedKVCache(spec, dev)
        if fill_from is None:
            self.cache.key.normal_(generator=torch.Generator(dev).manual_seed(seed))
            self.cache.value.normal_(generator=torch.Generator(dev).manual_seed(seed + 1))
        else:
            self._copy_context(fill_from, context, ring)
        t = k + 1
        self.positions = [context + j for _ in range(batch) for j in range(t)]
        self.qlens, self.ctx = [t] * batch, [context] * batch
        self.ids = torch.randint(0, cfg.vocab_size, (batch * t,), generator=g).to(dev)
        if fill_from is not None:                   # the same tokens and drafts (a prefix of them when k is smaller)
            self.ids = fill_from.ids.view(batch, -1)[:, :t].reshape(-1).clone()
        drafts = self.ids.view(batch, t)[:, 1:].reshape(-1).to(torch.int32)
        cu = [t * (r + 1) for r in range(batch)]
        self.spec = SpecDecodeMetadata.build([k] * batch, cu, drafts, device=dev)
        probe = AttentionMetadata.build(self.cache, NullWriter(), self.positions, self.qlens, self.tables,
                                        self.ctx, attention="torch", sliding=sliding)
        self.window = Window.from_metadata(self.spec, cu, probe.slot_mapping)

    def _copy_context(self, other: "StepCase", context: int, ring: int | None) -> None:
        """This cache's positions (the last `ring` of 0..context-1) from `other`'s linear cache."""
        from nwor_lab.kv import block_table_tensor, build_slot_mapping
        keep = torch.arange(max(0, context - ring) if ring else 0, context)
        req = torch.arange(self.batch).repeat_interleave(len(keep))
        pos = keep.repeat(self.batch)
        src = build_slot_mapping(block_table_tensor(other.tables), req, pos, BLOCK)
        dst = build_slot_mapping(block_table_tensor(self.tables), req, pos, BLOCK, ring)
        for mine, theirs in ((self.cache.key, other.cache.key), (self.cache.value, other.cache.value)):
            mine[:, dst // BLOCK, dst % BLOCK] = theirs[:, src // BLOCK, src % BLOCK]

    def forward(self, policy, acceptance: Acceptance):
        """One fresh step through `policy` (begin, target forward, commit) -> final hidden `[T, h]`."""
        md = self._metadata(policy)
        policy.begin(self.window, kind="verify")
        hidden = self.model(self.ids, md)
        policy.commit(acceptance)
        return hidden

    def _metadata(self, writer):
        return AttentionMetadata.build(self.cache, writer, self.positions, self.qlens, self.tables, self.ctx,
                                       attention=self.attention, slot_mapping=self.window.slot_mapping,
                                       sliding=self.sliding, num_drafts=[self.k] * self.batch)

    def forced(self, rate: float) -> Acceptance:
        """`round(rate * k * R)` accepted drafts, spread evenly over the requests (prefix rule)."""
        total = round(rate * self.k * self.batch)
        acc = [total // self.batch + (1 if r < total % self.batch else 0) for r in range(self.batch)]
        return Acceptance.from_accepted_len(self.window, acc)

    def step_fn(self, policy, acceptance: Acceptance | None):
        """The step's closure for `policy` (None: the NullWriter step without a KV path)."""
        writer = policy if policy is not None else NullWriter()
        md = self._metadata(writer)
        w, spec, model = self.window, self.spec, self.model
        rows = spec.logits_indices.long()

        def step():
            if policy is not None:
                policy.begin(w, kind="verify")
            hidden = model(self.ids, md)
            logits = model.compute_logits(hidden[rows]).float()
            sampled = rejection_sample(spec, None, logits, temperature=0.0)
            scv_mask(w.draft_token_ids, w.cu_num_draft_tokens, sampled, w.token_req, w.token_draft_pos)
            if policy is not None:
                policy.commit(acceptance)
            return sampled       # [R, k + 1]; under a graph, the static output of the replays
        return step


def measure(case: StepCase, rates, *, graphs: bool = True, iters: int = 3, reps: int = 11) -> list[dict]:
    """Per forced rate: eager and graphed µs per step for `none` and every write policy, measured
    round-robin (host drift hits every mode alike), with ratios to `off` and the KV share."""
    rows = []
    for rate in rates:
        acceptance = case.forced(rate)
        fns = {"none": case.step_fn(None, None)}
        for mode in NWOR_MODES:
            policy = make_policy(LabConfig(nwor_mode=mode, validate=False, attention=case.attention),
                                 case.cache, records=False)
            policy.reserve(case.window.num_tokens)       # nothing may be allocated during capture
            fns[mode] = case.step_fn(policy, acceptance)
        kinds = {"eager_us": interleaved_time_us(fns, iters=iters, reps=reps)}
        if graphs:
            captured = {name: capture_graph(fn) for name, fn in fns.items()}
            kinds["graph_us"] = interleaved_time_us({n: g.replay for n, g in captured.items()},
                                                    iters=iters, reps=reps)
            del captured
        out = {"rate": rate, "accepted": int(acceptance.accepted_len.sum()), "drafts": case.k * case.batch}
        for name in fns:
            out[name] = {kind: round(t[name], 1) for kind, t in kinds.items()}
        for kind in kinds:
            for mode in NWOR_MODES:
                out[mode][kind.replace("_us", "_vs_off")] = round(out[mode][kind] / out["off"][kind], 4)
                out[mode][kind.replace("_us", "_kv_share")] = round(1 - out["none"][kind] / out[mode][kind], 4)
        rows.append(out)
    return rows


def run(models=("shipped", "8b"), batches=(1, 16, 64), ks=(2, 4, 8), rates=(0.2, 0.5, 0.8),
        context: int = 1024, attention: str = "auto", graphs: bool = True, command: str = "") -> dict:
    results = []
    for name in models:
        model = make_model(name)
        for batch, k in itertools.product(batches, ks):
            case = StepCase(model, batch, k, context, attention)
            with torch.no_grad():
                rows = measure(case, rates, graphs=graphs)
            for row in rows:
                row.update(model=name, batch=batch, k=k, context=context, tokens=case.window.num_tokens)
                results.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)   # progress: nothing lost on a crash
            del case
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    from nwor_lab.model.attention import use_kernel
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "attention": "triton" if use_kernel(attention, torch.device("cuda")) else "torch",
            "command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "block_size": BLOCK, "results": results}


@torch.no_grad()
def profile_one(model: str, batch: int, k: int, rate: float, context: int, attention: str, mode: str) -> int:
    """One warm eager step of `mode` inside the profiler range (what ncu measures DRAM bytes of)."""
    case = StepCase(make_model(model), batch, k, context, attention)
    acceptance = case.forced(rate)
    policy = make_policy(LabConfig(nwor_mode=mode, validate=False, attention=attention), case.cache, records=False)
    fn = case.step_fn(policy, acceptance)
    fn(), fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(json.dumps({"profiled": mode, "model": model, "batch": batch, "k": k, "rate": rate,
                      "accepted": int(acceptance.accepted_len.sum()), "tokens": case.window.num_tokens}))
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
    p.add_argument("--profile", metavar="MODE", choices=NWOR_MODES,
                   help="run one eager step of MODE (off/cow/stage) of the first "
                   "model/batch/k/rate between cudaProfilerStart/Stop, for ncu --profile-from-start off")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UsageError("bench step: needs a CUDA device (none is visible here); run it on a GPU machine")
    if args.profile:
        return profile_one(args.models[0], args.batches[0], args.ks[0], args.rates[0], args.context,
                           args.attention, args.profile)
    result = run(args.models, args.batches, args.ks, args.rates, args.context, args.attention,
                 not args.no_graphs, "nwor-lab bench step " + " ".join(argv))
    text = json.dumps(result, indent=1)
    if args.out:
        atomic.write_text(args.out, text + "\n")
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
