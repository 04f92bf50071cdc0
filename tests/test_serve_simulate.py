"""`--k auto` offline (`nwor_lab.serve.simulate`): the cost model follows the runner's pre-launch rule,
and AdaptiveK on the H200-shaped costs meets issue 39's rules against every fixed k (steady traffic
within 3 % of the best fixed k at 8 and 32 requests, above target-only; the 0.9:0.1:0.9 phases 1.10x
the best fixed k at 32 requests). One seed each: the simulator is deterministic given its seed."""
import pytest

from nwor_lab.serve import AdaptiveK
from nwor_lab.serve.simulate import H200_8B, StepCosts, compare, oracle, run_auto

COSTS = StepCosts(decode_ms={2: 1.0}, bucket_ms={2: (2.0, 3.0, 4.0)}, host_ms=0.5)


class Scripted:
    """A controller that answers a fixed list of counts (then k_max) and records what it saw."""

    def __init__(self, counts, k_max=2):
        self.counts, self.k_max = list(counts), k_max
        self.history, self.jumps, self.seen = [], 0, []

    def choose(self, n):
        k = self.counts.pop(0) if self.counts else self.k_max
        self.history.append((n, k, "model"))
        return k

    def observe_step(self, entries, seconds):
        self.seen.append((entries[0].drafted[0], round(seconds * 1e3, 6)))


def test_a_step_is_launched_ahead_only_between_two_of_its_count_and_runs_the_larger_bucket():
    """k_max 2, the engine asks two steps ahead: the counts run 2 2 | 2 2 0 2 2 ... (the script's 0
    lands on the fifth step). The step before the 0 drafts 0 (bucket 2, not launched ahead:
    k_{s+1} differs), the 0 step verifies none but drafts 2 (bucket 2, +host), the step after it
    too (+host): three steps pay the host, the 0 step still costs bucket 2."""
    ctl = Scripted([2, 2, 0])
    run_auto(COSTS, 2, ("0.5",), total_tokens=40, controller=ctl)
    counts = [k for k, _ in ctl.seen]
    assert counts[:6] == [2, 2, 2, 2, 0, 2]
    ms = [t for _, t in ctl.seen]
    assert ms[:6] == [4.5, 4.0, 4.0, 4.5, 4.5, 4.5]     # the first: no step before it to overlap
    # a fixed k: every step launched ahead in its own bucket
    fixed = compare(COSTS, 2, ("1.0",), total_tokens=60, controller=AdaptiveK(2))["fixed"]
    assert fixed[2]["launched_ahead_fraction"] == 1.0 and fixed[2]["tokens_per_s"] == pytest.approx(2 * 3 / 4e-3)


def test_the_cost_model_names_what_is_wrong_and_the_oracle_bounds_every_run():
    with pytest.raises(ValueError, match="decode_ms does not"):
        StepCosts(decode_ms={}, bucket_ms={2: (1.0, 2.0)}, host_ms=0.0)
    with pytest.raises(ValueError, match="positive"):
        StepCosts(decode_ms={2: 1.0}, bucket_ms={2: (1.0, 0.0)}, host_ms=0.0)
    with pytest.raises(ValueError, match="controller k_max"):
        run_auto(COSTS, 2, ("shipped",), 10, controller=AdaptiveK(4))
    # all accepted: k_max's 3 tokens a request in 4 ms beat 1 in 2 ms
    assert oracle(COSTS, 2, ("1.0",)) == pytest.approx(2 * 3 / 4e-3)


@pytest.mark.parametrize("n", [8, 32])
def test_k_auto_keeps_up_with_the_best_fixed_k_on_steady_traffic(n):
    """The H200 runs' loss (0.94-0.96x of k 4) came from re-measuring k = 0 every 50 decisions, each
    time in a lone step that also cost its neighbours their pre-launch; the simulator shows it
    (0.969x / 0.971x before) and the controller now stays within 3 %."""
    r = compare(H200_8B, n, ("shipped",))
    assert r["best_fixed"] == 4
    assert r["over_best_fixed"] >= 0.97 and r["over_target_only"] >= 1.0
    assert r["auto"]["count_changes"] <= 4 and r["auto"]["launched_ahead_fraction"] >= 0.95
    # warmed up as `bench serve` warms its engines (the anchors measured there): k 4 throughout
    warm = compare(H200_8B, n, ("shipped",), warmup_tokens=2 * 256 * n)["auto"]
    assert warm["steps_by_drafts"] == {"4": warm["steps"]} and warm["explored"] == 0


@pytest.mark.parametrize("n, over_best", [(8, 1.05), (32, 1.10)])
def test_k_auto_beats_every_fixed_k_on_the_phase_workload(n, over_best):
    """0.9 : 0.1 : 0.9 acceptance. At 8 requests even a controller that knows each phase and switches
    for free makes only 1.10x the best fixed k (k 1 costs little more than decoding there), so the
    bound asked of k auto is 1.05x; at 32 requests, the issue's 1.10x."""
    r = compare(H200_8B, n, ("0.9", "0.1", "0.9"))
    assert r["over_best_fixed"] >= over_best and r["over_target_only"] >= 1.0
    assert r["auto"]["tokens_per_s"] <= r["oracle_tokens_per_s"]


def test_probes_wait_while_no_deeper_count_could_win():
    """At 32 requests on the H200 costs, drafting 1 with its first drafts accepted 1 time in 20: even were
    every deeper draft accepted, k 2..4 would lose to k 1 (below about 1 in 10), so a probe could not
    change the choice and waits its longest (4 x explore_every); with 9 in 10 accepted, the probes keep
    their budget; decoding (count 0: nothing verified) keeps it too. Fed through `observe_step` as the
    engine feeds it."""
    from nwor_lab.engine import WindowTrace

    def fed(rate):
        ctl, n = AdaptiveK(4), 32
        for k in (0, 1, 4):
            for _ in range(5):          # timed between two of its shape, the first of them not at all
                got = [1 if i < rate * n else 0 for i in range(n)] if k else [0] * n
                w = WindowTrace(0, "verify", list(range(n)), ["spec"] * n, [k] * n, got, [[0] * (a + 1) for a in got])
                ctl.observe_step([w], H200_8B.bucket_ms[n][k] / 1e3)
        return ctl

    low, high = fed(0.05), fed(0.9)
    times = low.step_times(32, low.candidates)
    assert low.probe_upside(times, 1) < 0 < high.probe_upside(times, 1)
    assert low.probe_interval(32, 1) == 4 * low.explore_every
    assert high.probe_interval(32, 1) <= high.explore_every
    assert low.probe_interval(32, 0) <= low.explore_every
