"""The host's bookkeeping builds its windows from what the step laid out, not by a second walk: the
verify window of a rows step (`window_chain.host_rows_window`, from `StepInputs.host_rows`' lists)
equals `Window.from_counts` of the same counts and slots, field by field, on a step that mixes
prefills, spec requests with k drafts and ones with fewer; the draft chain's all-rejected acceptance
(`Acceptance.rejecting_all`, laid out directly) equals `from_accepted_len` of zeros."""
import torch

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.engine import chain_window
from nwor_lab.engine.window_chain import host_rows_window
from nwor_lab.model.toy import toy_pair
from nwor_lab.window import Acceptance, Window

FIELDS = ("slot_mapping", "token_req", "token_draft_pos", "draft_rows")


def same_window(a: Window, b: Window) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and torch.equal(x, y), f
    assert a.num_scheduled_tokens == b.num_scheduled_tokens and a.num_draft_tokens == b.num_draft_tokens


def test_host_rows_window_is_from_counts_of_the_same_step():
    t, h = toy_pair(0)
    e = SpecEngine(t, h, LabConfig(nwor_mode="stage"), k=3, num_blocks=64, block_size=4, max_num_seqs=4)
    seen = []
    real = e.window_kind.host_window

    def check(hd, result):
        got = real(hd, result)
        want = Window.from_counts(hd["qlens"], hd["ndrafts"], torch.tensor(hd["slots"], dtype=torch.long))
        same_window(got[0], want)
        ref = Acceptance.from_accepted_len(want, result.accepted)
        assert torch.equal(got[1].draft_mask, ref.draft_mask) and torch.equal(got[1].commit_mask, ref.commit_mask)
        seen.append(sorted(set(hd["ndrafts"])))
        return got
    e.window_kind.host_window = check
    e.add_request([1, 2, 3, 4, 5], 12)
    e.add_request([6, 7], 12)
    e.step_with_progress()
    e.step_with_progress()
    e.add_request([8, 9, 10], 12)           # a prefill next to spec requests
    e.run()
    assert any(0 in s and len(s) > 1 for s in seen)      # a step held prefills (0 drafts) and drafts
    assert any(max(s) == 3 for s in seen)


def test_rejecting_all_is_accepted_len_zero():
    w = chain_window([[5, 6, 7], [], [9]], torch.device("cpu"))
    got, want = Acceptance.rejecting_all(w), Acceptance.from_accepted_len(w, [0] * w.num_reqs)
    for f in ("draft_mask", "accepted_len", "commit_mask"):
        x, y = getattr(got, f), getattr(want, f)
        assert x.dtype == y.dtype and torch.equal(x, y), f
