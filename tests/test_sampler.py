"""Rejection sampler: greedy argmax rules, seeded reproducibility, the target distribution."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nwor_lab.speculative.metadata import SpecDecodeMetadata
from nwor_lab.speculative.sampler import PLACEHOLDER_TOKEN_ID, rejection_sample


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


def _first_token_frequencies(draft_probs, draft_ids, p_logits, n_samples, temperature=1.0):
    """Run n_samples one-request windows in one batch; histogram each row's first token."""
    vocab = p_logits.shape[0]
    m = SpecDecodeMetadata.make_dummy([[int(d), int(d)] for d in draft_ids])
    logits = p_logits.repeat(3 * n_samples, 1)   # 2 target rows + 1 bonus row per request
    probs = None if draft_probs is None else draft_probs.repeat(2 * n_samples, 1)
    out = rejection_sample(m, probs, logits, temperature=temperature,
                           generator=torch.Generator().manual_seed(1234))
    return torch.bincount(out[:, 0].long(), minlength=vocab).double() / n_samples


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


@pytest.mark.gpu
def test_cuda_matches_cpu_greedy():
    m, logits, probs = _random_window(4, num_reqs=32)
    cpu = rejection_sample(m, None, logits)
    gpu = rejection_sample(m.to("cuda"), None, logits.cuda())
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = rejection_sample(m.to("cuda"), probs.cuda(), logits.cuda(), temperature=1.0, generator=g)
    assert out.shape == cpu.shape
