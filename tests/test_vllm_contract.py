"""The lab against vLLM's own code: metadata, greedy and stochastic rejection sampling, accepted counts.

vLLM 0.33.0's pinned wheel is fetched once (`tests/vllm_contract/wheel.py`, cached under
~/.cache/nwor_lab/vllm-wheel or $NWOR_LAB_VLLM_WHEEL_DIR); its `GPUModelRunner._calc_spec_decode_metadata`,
`RejectionSampler` and `Sampler` run unmodified in a subprocess with their Triton kernels under
Triton's CPU interpreter (`tests/vllm_contract/worker.py`). Every case below runs through both and
must match exactly:

  * metadata: `SpecDecodeMetadata.build(..., input_ids=...)` == vLLM's runner, every field and dtype;
  * greedy and stochastic sampling: same sampled ids, with per-request seeded generators and with
    torch's default generator seeded alike (the lab draws its noise in vLLM's order and layout);
  * the issue's cases: padded draft ids (-1), a greedy request given as `temperature=tensor([0.])`,
    drafts whose draft probability is 0 (vLLM rejects them and may recover the same id);
  * accepted counts: the lab's SCV op on vLLM's own output == vLLM's runner count
    `(ids != -1).sum(1) - 1`, also where comparing ids would disagree.

Skips (with the reason) when the wheel cannot be fetched or triton is missing; any other failure
fails. 8-10 s with the wheel cached (2 shared CPU cores), plus about 5 s to download it once.
"""
from __future__ import annotations

import importlib.util
import os
import zlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nwor_lab.ops.scv import accepted_len_by_ids, scv_mask
from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample

HERE = Path(__file__).resolve().parent
FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
          "bonus_logits_indices", "logits_indices")
NUM_RANDOM = 48


def case(name, num_draft_tokens, extra_tokens, vocab, *, draft_ids=None, temperature=None, draft_probs=None,
         seeds=None, global_seed=0, logits=None, lab_temperature=None, sample=True, gen=None):
    """One window: request r schedules `extra_tokens[r]` prefill tokens, t_last and its drafts."""
    gen = gen or torch.Generator().manual_seed(zlib.crc32(name.encode()))     # stable across processes
    num_reqs = len(num_draft_tokens)
    sched = [e + n + 1 for e, n in zip(extra_tokens, num_draft_tokens)]
    cu = torch.tensor(sched).cumsum(0).tolist()
    input_ids = torch.randint(0, vocab, (cu[-1],), generator=gen, dtype=torch.int32)
    total = sum(num_draft_tokens)
    if draft_ids is not None:                                   # drafts are each request's last n_r tokens
        pos = [c - n + j for c, n in zip(cu, num_draft_tokens) for j in range(n)]
        input_ids[torch.tensor(pos, dtype=torch.long)] = torch.tensor(draft_ids, dtype=torch.int32)
    c = dict(name=name, num_draft_tokens=list(num_draft_tokens), cu_num_scheduled_tokens=cu, input_ids=input_ids,
             logits=None, draft_probs=draft_probs, temperature=None, seeds=dict(seeds or {}), global_seed=global_seed,
             lab_temperature=lab_temperature)
    if sample:
        c["logits"] = logits if logits is not None else torch.randn(total + num_reqs, vocab, generator=gen) * 3
        c["temperature"] = temperature if temperature is not None else torch.zeros(num_reqs)
    return c


def random_case(i: int) -> dict:
    g = torch.Generator().manual_seed(1000 + i)
    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))
    num_reqs, vocab, k = ri(1, 8), (8, 16, 40)[i % 3], ri(1, 5)
    n = [ri(0, k) for _ in range(num_reqs)]
    extra = [ri(0, 3) for _ in range(num_reqs)]
    total = sum(n)
    drafts = torch.randint(0, vocab, (total,), generator=g)
    drafts[torch.rand(total, generator=g) < 0.1] = -1                       # padded draft slots
    mode = ("greedy", "random", "mixed")[i % 3]
    temps = torch.tensor([(0.0, 0.5, 1.0, 1.7)[ri(0, 3)] for _ in range(num_reqs)])
    temps = {"greedy": torch.zeros(num_reqs), "random": temps.clamp(min=0.5), "mixed": temps}[mode]
    probs = None
    if i % 2:
        probs = torch.softmax(torch.randn(total, vocab, generator=g) * 2, -1)
        zero = (torch.rand(total, generator=g) < 0.2) & (drafts >= 0)       # zero-probability drafts
        probs[zero.nonzero().flatten(), drafts[zero]] = 0.0
        probs = probs / probs.sum(-1, keepdim=True)
    seeded = [r for r in range(num_reqs) if i % 4 != 3 and (i % 4 == 0 or ri(0, 1))]   # all, some or none
    seeds = {r: 7 * i + r for r in seeded}
    # Make about two drafts in three the target's favourite, so long accepted prefixes happen.
    logits = torch.randn(total + num_reqs, vocab, generator=g) * 3
    rows = torch.tensor([sum(n[:r]) + r + j for r in range(num_reqs) for j in range(n[r])], dtype=torch.long)
    boost = (torch.rand(total, generator=g) < 0.67) & (drafts >= 0)
    logits[rows[boost], drafts[boost]] += 8.0
    return case(f"random-{i}-{mode}", n, extra, vocab, draft_ids=drafts.tolist(), temperature=temps,
                draft_probs=probs, seeds=seeds, global_seed=i, gen=g, logits=logits)


def issue_cases() -> list[dict]:
    out = []
    # vLLM's own docstring example (metadata only).
    out.append(case("vllm-docstring-example", [3, 0, 2, 0, 1], [0, 99, 0, 99, 0], 300, sample=False))
    # 1. Padded draft ids: V = 8, drafts [-1, 3], temperature 1, no draft probs.
    out.append(case("padded-draft-temperature-1", [2], [0], 8, draft_ids=[-1, 3], temperature=torch.ones(1),
                    seeds={0: 5}))
    # ... and a greedy request given as temperature=tensor([0.]) (vLLM: all_greedy).
    out.append(case("padded-draft-greedy-as-tensor", [2], [0], 8, draft_ids=[-1, 3], temperature=torch.zeros(1),
                    lab_temperature=torch.zeros(1)))
    # 2. Zero draft probability: q(d) = 0 where p(d) > 0; many seeded requests in one batch, so
    #    some recover the draft's own id.
    v, reqs = 6, 32
    q = torch.full((reqs, v), 0.2)
    q[:, 2] = 0.0
    logits = torch.zeros(2 * reqs, v)                                         # p uniform: p(2) = 1/6
    out.append(case("zero-probability-draft", [1] * reqs, [0] * reqs, v, draft_ids=[2] * reqs,
                    temperature=torch.ones(reqs), draft_probs=q, seeds={r: 100 + r for r in range(reqs)},
                    logits=logits))
    # Mixed: padding, zero probability and greedy in one batch, unseeded (torch's default RNG).
    q2 = torch.softmax(torch.randn(6, 8, generator=torch.Generator().manual_seed(3)), -1)
    q2[1, 3] = 0.0
    out.append(case("mixed-padding-zero-prob-greedy", [2, 3, 1], [1, 0, 2], 8, draft_ids=[-1, 3, 5, 3, -1, 0],
                    temperature=torch.tensor([1.0, 0.8, 0.0]), draft_probs=q2 / q2.sum(-1, keepdim=True),
                    global_seed=42))
    return out


def all_cases() -> list[dict]:
    return issue_cases() + [random_case(i) for i in range(NUM_RANDOM)]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """Every case through vLLM's code in one worker process -> (cases, results)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: vLLM's rejection kernels need Triton's CPU interpreter")
    sys.path.insert(0, str(HERE))
    from vllm_contract import wheel

    src = wheel.fetch()
    if isinstance(src, str):
        pytest.skip(f"vLLM {wheel.VERSION} wheel unavailable: {src}")
    cases = all_cases()
    tmp = tmp_path_factory.mktemp("vllm_contract")
    torch.save(cases, tmp / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(HERE / "vllm_contract" / "worker.py"), str(src), wheel.VERSION,
                           str(tmp / "cases.pt"), str(tmp / "results.pt")], env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"vLLM worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = torch.load(tmp / "results.pt", weights_only=False)
    return cases, out["results"]


def lab_metadata(c) -> SpecDecodeMetadata:
    return SpecDecodeMetadata.build(c["num_draft_tokens"], c["cu_num_scheduled_tokens"], input_ids=c["input_ids"])


def lab_sample(c, md: SpecDecodeMetadata) -> torch.Tensor:
    temp = c["lab_temperature"]
    if temp is None:
        temp = 0.0 if bool((c["temperature"] == 0).all()) else c["temperature"]
    gens = {r: torch.Generator().manual_seed(s) for r, s in c["seeds"].items()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c["global_seed"])                 # vLLM's unseeded requests: torch's default RNG
        return rejection_sample(md, c["draft_probs"], c["logits"], temperature=temp, generators=gens)


def test_metadata_matches_vllm_runner(vllm_run):
    cases, results = vllm_run
    for c, v in zip(cases, results):
        md = lab_metadata(c)
        assert md.num_draft_tokens == v["num_draft_tokens"], c["name"]
        for name in FIELDS:
            got, want = getattr(md, name), v[name]
            assert got.dtype == want.dtype and torch.equal(got, want), f"{c['name']}: {name} {got} != {want}"


def _sampled(cases, results, which):
    for c, v in zip(cases, results):
        if c["logits"] is None:
            continue
        greedy = bool((c["temperature"] == 0).all())
        if which == "greedy" and greedy or which == "stochastic" and not greedy:
            yield c, v["sampled_token_ids"], lab_sample(c, lab_metadata(c))


@pytest.mark.parametrize("which", ["greedy", "stochastic"])
def test_sampled_ids_match_vllm(vllm_run, which):
    cases, results = vllm_run
    checked = 0
    for c, want, got in _sampled(cases, results, which):
        assert got.dtype == want.dtype == torch.int32
        assert torch.equal(got, want), f"{c['name']}:\nlab  {got.tolist()}\nvLLM {want.tolist()}"
        checked += 1
    assert checked >= 10


def test_accepted_counts_match_vllm_runner(vllm_run):
    """SCV on vLLM's own output counts what vLLM's runner counts, including zero-probability
    drafts recovered as themselves (where comparing ids would accept them) and padding drafts."""
    cases, results = vllm_run
    disagreements = accepted = 0
    for c, v in zip(cases, results):
        if c["logits"] is None:
            continue
        out = v["sampled_token_ids"]
        md = lab_metadata(c)
        runner = (out != PLACEHOLDER_TOKEN_ID).sum(1).to(torch.int32) - 1     # vLLM's runner
        _, counted, _ = scv_mask(md.draft_token_ids, md.cu_num_draft_tokens, out)
        assert torch.equal(counted, runner), c["name"]
        disagreements += int((accepted_len_by_ids(md.draft_token_ids, md.cu_num_draft_tokens, out) != runner).sum())
        accepted += int(runner.sum())
    assert disagreements > 0, "no case exercised a zero-probability draft recovered as itself"
    assert accepted > 100, "the cases hardly accept any draft"


def test_issue_cases_behave_as_vllm(vllm_run):
    cases, results = vllm_run
    by_name = {c["name"]: (c, v) for c, v in zip(cases, results)}
    c, v = by_name["padded-draft-temperature-1"]
    out = v["sampled_token_ids"]
    assert out.shape == (1, 3) and out[0, 0] >= 0 and out[0, 1:].tolist() == [-1, -1]   # -1 rejected
    c, v = by_name["padded-draft-greedy-as-tensor"]
    assert v["sampled_token_ids"][0, 0] == c["logits"][0].argmax()
    c, v = by_name["zero-probability-draft"]
    out = v["sampled_token_ids"]
    assert (out[:, 1] == -1).all()                            # every zero-probability draft rejected
    assert (out[:, 0] == 2).any()                             # ... and some recovered as the draft id
