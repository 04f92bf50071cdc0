"""The step's records counted behind the next launch (`SpecEngine.flush_records`): the same records,
metrics and trace as counting each window as it ends; a read never sees one missing; an observer
attached mid-run (which reads records inside the next step's body) gets them all first."""
from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine
from nwor_lab.engine.runner import StepRunner
from nwor_lab.model.toy import toy_pair


class Reader:
    """An observer that reads the metrics at every policy phase (inside the step body, windows open)
    and at every window's end."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def on_phase(self, event):
        self.seen.append(len(self.engine.metrics.records))

    def on_window_end(self, engine, entry, window):
        assert entry.record is not None


def run(mode: str, *, watch_from: int | None = None, padded: bool = False):
    target, head = toy_pair(0)
    e = SpecEngine(target, head, LabConfig(nwor_mode=mode), k=3, block_size=4, max_num_seqs=3, seed=1)
    if padded:                   # the bucketed path with its pre-launch, eagerly (as a graph would run)
        e.runner = StepRunner(e, 3, 1024, capture=False, pad=True)
    reqs = [e.add_request(p, 18) for p in ([1, 2, 3], [4, 5, 6, 7, 8], [9, 10])]
    steps, pending = 0, []
    while e.scheduler.has_work:
        if steps == watch_from:
            e.observers.append(Reader(e))
        e.step_with_progress()
        pending.append(len(e._pending_records))     # (peeked, not read: a read would count them)
        steps += 1
        if steps == 2:          # a read between steps: the last window's record is there
            assert e.trace[-1].record is not None and e.trace[-1].record.mode == mode
    return ([r.output for r in reqs], [w.to_dict() for w in e.trace], e.metrics.summary(),
            e.draft_metrics.summary(), [rec.index for rec in e.metrics.records]), max(pending)


def test_deferred_records_equal_records_counted_at_once():
    for mode in ("off", "cow", "stage"):
        for padded in (False, True):
            deferred, waited = run(mode, padded=padded)
            at_once, none_waited = run(mode, watch_from=0, padded=padded)   # an observer from the start: no deferral
            assert waited > 0 and none_waited == 0           # records did wait in one run, not in the other
            assert deferred == at_once, (mode, padded)
            assert deferred[4] == list(range(len(deferred[4])))     # window indices in the order they ran


def test_an_observer_attached_mid_run_sees_every_record_and_breaks_nothing():
    reference = run("stage", padded=True)[0]
    for start in (1, 3):
        assert run("stage", watch_from=start, padded=True)[0] == reference
