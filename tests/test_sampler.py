"""Rejection sampler: greedy argmax rules, seeded reproducibility, the target distribution,
padding (-1) and zero-probability drafts as vLLM handles them, per-request generators."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.ops.scv import accepted_len_by_ids, scv_mask_reference
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample, sample_from_probs
from nwor_lab.viz.sampling import first_token_frequencies


def greedy_naive(metadata, target_logits):
    """Per request: accept drafts while they equal the target argmax, then one target token."""
    k = metadata.max_spec_len
    rows, d0 = [], 0
    drafts = metadata.draft_token_ids.tolist()
    for r, n in enumerate(metadata.num_draft_tokens):
        row0 = int(metadata.bonus_logits_indices[r]) - n
        out = []
        for j in range(n):
            best = int(target_logits[row0 + j].argmax())
            if drafts[d0 + j] != best:
                out.append(best)                 # recovered
                break
            out.append(drafts[d0 + j])
        else:
            out.append(int(target_logits[row0 + n].argmax()))   # bonus
        rows.append(out + [PLACEHOLDER_TOKEN_ID] * (k + 1 - len(out)))
        d0 += n
    return rows


def test_greedy_hand_example():
    m = SpecDecodeMetadata.make_dummy([[1, 2, 3], [], [4, 0]])
    logits = torch.zeros(8, 6)
    for row, tok in enumerate([1, 2, 5, 3, 3, 4, 1, 2]):
        logits[row, tok] = 5.0
    out = rejection_sample(m, None, logits)
    assert out.dtype == torch.int32
    assert out.tolist() == [[1, 2, 5, -1],      # d3=3 rejected, target says 5
                            [3, -1, -1, -1],    # no drafts: the sampled token only
                            [4, 1, -1, -1]]     # d2=0 rejected, recovered 1


def test_all_accepted_emits_bonus():
    m = SpecDecodeMetadata.make_dummy([[2, 3]])
    logits = torch.zeros(3, 5)
    logits[0, 2] = logits[1, 3] = logits[2, 4] = 1.0
    assert rejection_sample(m, None, logits).tolist() == [[2, 3, 4]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_greedy_matches_naive(num_draft, seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 4                                   # small vocab: drafts often equal the argmax
    drafts = [torch.randint(vocab, (n,), generator=g).tolist() for n in num_draft]
    m = SpecDecodeMetadata.make_dummy(drafts)
    logits = torch.randn(sum(num_draft) + len(num_draft), vocab, generator=g)
    assert rejection_sample(m, None, logits).tolist() == greedy_naive(m, logits)
    # Greedy ignores draft probabilities and any generator.
    probs = torch.softmax(torch.randn(sum(num_draft), vocab, generator=g), -1)
    assert rejection_sample(m, probs, logits, temperature=torch.zeros(len(num_draft))).tolist() == \
        greedy_naive(m, logits)


def _random_window(seed, num_reqs=16, k=3, vocab=7):
    g = torch.Generator().manual_seed(seed)
    num_draft = torch.randint(0, k + 1, (num_reqs,), generator=g).tolist()
    m = SpecDecodeMetadata.make_dummy([torch.randint(vocab, (n,), generator=g).tolist() for n in num_draft])
    logits = torch.randn(sum(num_draft) + num_reqs, vocab, generator=g)
    probs = torch.softmax(torch.randn(sum(num_draft), vocab, generator=g), -1)
    return m, logits, probs


@pytest.mark.parametrize("with_probs", [False, True])
def test_stochastic_is_reproducible_per_seed(with_probs):
    m, logits, probs = _random_window(1)
    probs = probs if with_probs else None
    run = lambda s: rejection_sample(m, probs, logits, temperature=1.0,
                                     generator=torch.Generator().manual_seed(s))
    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # Format: accepted drafts, one token, then placeholders only.
    for row, n in zip(a.tolist(), m.num_draft_tokens):
        emitted = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
        assert row == emitted + [PLACEHOLDER_TOKEN_ID] * (len(row) - len(emitted))
        assert 1 <= len(emitted) <= n + 1


def test_mixed_temperature_keeps_greedy_rows_greedy():
    m, logits, probs = _random_window(2)
    temp = torch.tensor([0.0, 1.0] * 8)
    out = rejection_sample(m, probs, logits, temperature=temp, generator=torch.Generator().manual_seed(0))
    greedy = greedy_naive(m, logits)
    for r in range(0, 16, 2):
        assert out[r].tolist() == greedy[r]


# The test's batching lives in the package so that chapter 17 runs it live (one copy of it).
_first_token_frequencies = first_token_frequencies


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_token_follows_target_distribution(temperature):
    # Speculative sampling's guarantee: whatever q proposes, the emitted token is distributed as p.
    n = 20_000
    p_logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = torch.softmax(p_logits / temperature, -1).double()
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])       # far from p: accepting blindly would show q
    draft_ids = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(5))
    freq = _first_token_frequencies(q, draft_ids, p_logits, n, temperature)
    # Binomial std <= 0.0036 at n=20k; 0.02 is > 5 sigma, and the seed is fixed.
    assert (freq - p).abs().max() < 0.02, (freq, p)


def test_first_token_follows_target_with_point_mass_drafter():
    n = 20_000
    p_logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = torch.softmax(p_logits, -1).double()
    draft_ids = torch.full((n,), 2)               # EAGLE-style: always proposes token 2
    freq = _first_token_frequencies(None, draft_ids, p_logits, n)
    assert (freq - p).abs().max() < 0.02, (freq, p)


def test_zero_draft_requests_sample_bonus_from_target():
    n = 20_000
    p = torch.tensor([0.6, 0.1, 0.3])
    m = SpecDecodeMetadata.make_dummy([[]] * n)
    out = rejection_sample(m, None, torch.log(p).repeat(n, 1), temperature=1.0,
                           generator=torch.Generator().manual_seed(3))
    assert out.shape == (n, 1)
    freq = torch.bincount(out[:, 0].long(), minlength=3).double() / n
    assert (freq - p.double()).abs().max() < 0.02


def test_argument_errors_name_the_argument():
    m = SpecDecodeMetadata.make_dummy([[1, 2], [3]])
    with pytest.raises(ValueError, match="target_logits"):
        rejection_sample(m, None, torch.zeros(4, 5))          # needs 3 + 2 rows
    with pytest.raises(TypeError, match="target_logits"):
        rejection_sample(m, None, torch.zeros(5, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(m, torch.zeros(3, 4), torch.zeros(5, 5), temperature=1.0)
    with pytest.raises(ValueError, match="temperature"):
        rejection_sample(m, None, torch.zeros(5, 5), temperature=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        rejection_sample(m, None, torch.zeros(5, 5), temperature=torch.ones(3))


# -- padding drafts (-1) --------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, "tensor0", 1.0, "mixed"])
@pytest.mark.parametrize("with_probs", [False, True])
def test_padding_draft_is_rejected_never_an_index(temperature, with_probs):
    # The case: V = 8, drafts [-1, 3] (vLLM pads draft slots with -1).
    g = torch.Generator().manual_seed(0)
    m = SpecDecodeMetadata.make_dummy([[-1, 3], [5, -1, 2], [4]])
    logits = torch.randn(9, 8, generator=g)
    logits[3, 5] = logits[7, 4] = 50.0                      # d = 5 and d = 4 are the argmax: accepted
    probs = torch.softmax(torch.randn(6, 8, generator=g), -1) if with_probs else None
    temp = {"tensor0": torch.zeros(3), "mixed": torch.tensor([0.0, 1.0, 0.5])}.get(temperature, temperature)
    for seed in range(20):
        out = rejection_sample(m, probs, logits, temperature=temp, generator=torch.Generator().manual_seed(seed))
        emitted = (out != PLACEHOLDER_TOKEN_ID).sum(1)
        assert emitted[0] == 1 and 0 <= out[0, 0] < 8        # d1 = -1 rejected, the target's token
        assert emitted[1] <= 2 and (out[1, 2:] == PLACEHOLDER_TOKEN_ID).all()   # never past d2 = -1
        if not isinstance(temp, float) or temp == 0.0:
            assert out[0, 0] == logits[0].argmax()              # greedy emits the target argmax there


def test_padding_draft_row_samples_from_the_target():
    # A rejected padding draft with no draft probabilities: the emitted token follows p itself
    # (max(p - 0, 0) = p), as in vLLM, where the masked load removes nothing for id -1.
    n = 20_000
    p = torch.tensor([0.5, 0.3, 0.2])
    m = SpecDecodeMetadata.make_dummy([[-1]] * n)
    out = rejection_sample(m, None, torch.log(p).repeat(2 * n, 1), temperature=1.0,
                           generator=torch.Generator().manual_seed(2))
    assert (out[:, 1] == PLACEHOLDER_TOKEN_ID).all()
    freq = torch.bincount(out[:, 0].long(), minlength=3).double() / n
    assert (freq - p.double()).abs().max() < 0.02


# -- zero-probability drafts --------------------------------------------------------------------
def test_zero_probability_draft_is_rejected_and_can_be_recovered_as_itself():
    n = 20_000
    p = torch.tensor([0.25, 0.25, 0.25, 0.25])
    q = torch.tensor([0.5, 0.5, 0.0, 0.0])                   # the drafter says it never proposes 2
    m = SpecDecodeMetadata.make_dummy([[2]] * n)
    out = rejection_sample(m, q.repeat(n, 1), torch.log(p).repeat(2 * n, 1), temperature=1.0,
                           generator=torch.Generator().manual_seed(4))
    assert (out[:, 1] == PLACEHOLDER_TOKEN_ID).all()         # never accepted (min(1, p/0) would accept)
    # Recovered from max(p - q, 0) = [0, 0, .25, .25]: half the time the draft's own id.
    freq = torch.bincount(out[:, 0].long(), minlength=4).double() / n
    assert (freq - torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64)).abs().max() < 0.02
    # Accepted length: the emitted count says 0, comparing ids would say 1 where 2 came back.
    sampled = out
    acc = scv_mask_reference(m.draft_token_ids, m.cu_num_draft_tokens, sampled)[1]
    assert (acc == 0).all()
    by_ids = accepted_len_by_ids(m.draft_token_ids, m.cu_num_draft_tokens, sampled)
    assert torch.equal(by_ids == 1, out[:, 0] == 2)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.booleans())
def test_emitted_count_equals_id_comparison_when_every_q_is_positive(seed, with_probs):
    """With q(x) > 0 everywhere (or greedy drafts) a recovered token never equals its draft, so the
    two ways of counting agree; the sampler's rows are always prefix, one token, placeholders."""
    m, logits, probs = _random_window(seed)
    temp = torch.tensor([0.0, 1.0, 0.6, 1.3] * 4)
    out = rejection_sample(m, probs if with_probs else None, logits, temperature=temp,
                           generator=torch.Generator().manual_seed(seed))
    counted = scv_mask_reference(m.draft_token_ids, m.cu_num_draft_tokens, out)[1]
    assert torch.equal(counted, (out != PLACEHOLDER_TOKEN_ID).sum(1).to(torch.int32) - 1)
    assert torch.equal(counted, accepted_len_by_ids(m.draft_token_ids, m.cu_num_draft_tokens, out))


# -- randomness: sample_from_probs, per-request generators, vLLM's order ----------------------------
def test_sample_from_probs_follows_probs_and_handles_zero_rows():
    n = 40_000
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    ids = sample_from_probs(p.repeat(n, 1) * 7.0, torch.Generator().manual_seed(0))   # unnormalised
    assert ids.dtype == torch.int64 and ids.shape == (n,)
    freq = torch.bincount(ids, minlength=4).double() / n
    assert (freq - p.double()).abs().max() < 0.015 and freq[1] == 0
    assert sample_from_probs(torch.zeros(3, 5), torch.Generator().manual_seed(0)).tolist() == [0, 0, 0]


def test_sample_from_probs_generators_redraw_their_rows():
    probs = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), -1)
    seeded = lambda: {1: torch.Generator().manual_seed(11), 3: torch.Generator().manual_seed(33)}
    a = sample_from_probs(probs, torch.Generator().manual_seed(5), generators=seeded())
    b = sample_from_probs(probs, torch.Generator().manual_seed(6), generators=seeded())
    assert a[1] == b[1] and a[3] == b[3]                     # seeded rows ignore the batch generator
    alone = sample_from_probs(probs[1:2], None, generators={0: torch.Generator().manual_seed(11)})
    assert alone[0] == a[1]
    # Every row seeded: the batch generator is not touched (vLLM skips the batch draw).
    g = torch.Generator().manual_seed(9)
    state = g.get_state()
    sample_from_probs(probs[:2], g, generators={0: torch.Generator(), 1: torch.Generator()})
    assert torch.equal(g.get_state(), state)


def test_seeded_request_does_not_depend_on_its_batch():
    """A request with its own generator gets the same tokens alone or in any batch (vLLM's
    per-request seeds): its bonus noise, uniforms and recovered noise all come from it."""
    m, logits, probs = _random_window(7, num_reqs=6, k=3)
    r = next(i for i, n in enumerate(m.num_draft_tokens) if n > 0)
    gens = lambda: {r: torch.Generator().manual_seed(1234)}
    full = rejection_sample(m, probs, logits, temperature=0.9, generator=torch.Generator().manual_seed(1),
                            generators=gens())
    other = rejection_sample(m, probs, logits, temperature=0.9, generator=torch.Generator().manual_seed(2),
                             generators=gens())
    assert torch.equal(full[r], other[r])
    lo = sum(m.num_draft_tokens[:r])
    n = m.num_draft_tokens[r]
    one = SpecDecodeMetadata.make_dummy([m.draft_token_ids[lo:lo + n].tolist()])
    rows = logits[lo + r:lo + r + n + 1]                     # its target rows and bonus row
    alone = rejection_sample(one, probs[lo:lo + n], rows, temperature=0.9,
                             generators={0: torch.Generator().manual_seed(1234)})
    assert alone[0].tolist() == full[r, :n + 1].tolist()


def test_greedy_draws_no_random_numbers():
    m, logits, _ = _random_window(3)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    rejection_sample(m, None, logits, temperature=0.0, generator=g)
    assert torch.equal(g.get_state(), state)


def test_generators_argument_errors():
    m, logits, _ = _random_window(3)
    with pytest.raises(ValueError, match="generators: keys \\[16\\]"):
        rejection_sample(m, None, logits, temperature=1.0, generators={16: torch.Generator()})
    with pytest.raises(TypeError, match="generators: expected a dict"):
        rejection_sample(m, None, logits, temperature=1.0, generators=[torch.Generator()])


@pytest.mark.gpu
def test_cuda_matches_cpu_greedy():
    m, logits, probs = _random_window(4, num_reqs=32)
    cpu = rejection_sample(m, None, logits)
    gpu = rejection_sample(m.to("cuda"), None, logits.cuda())
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = rejection_sample(m.to("cuda"), probs.cuda(), logits.cuda(), temperature=1.0, generator=g)
    assert out.shape == cpu.shape


@pytest.mark.gpu
def test_cuda_padding_and_zero_probability_drafts():
    """On CUDA a -1 draft must not reach a gather/scatter (a device-side assert would kill the
    process); zero-probability drafts are rejected there too."""
    m = SpecDecodeMetadata.make_dummy([[-1, 3], [2, 5]]).to("cuda")
    logits = torch.randn(6, 8, device="cuda")
    q = torch.softmax(torch.randn(4, 8, device="cuda"), -1)
    q[2, 2] = 0.0                                           # request 1's first draft: q(2) = 0
    for temp in (0.0, torch.zeros(2, device="cuda"), 1.0, torch.tensor([1.0, 0.5], device="cuda")):
        for probs in (None, q):
            g = torch.Generator(device="cuda").manual_seed(0)
            out = rejection_sample(m, probs, logits, temperature=temp, generator=g,
                                   generators={1: torch.Generator(device="cuda").manual_seed(1)}).cpu()
            assert out[0, 0] >= 0 and out[0, 1:].tolist() == [-1, -1]
            if probs is not None and bool((torch.as_tensor(temp) > 0).all()):
                assert out[1, 1] == -1
