"""Tree windows drawn: the frames a tree window leaves under each commit strategy (read from the cache's
bits), the tree and cost figures, the stepper on tree frames, and exercise (s)'s checker catching the
usual mistakes."""
import plotly.graph_objects as go
import pytest
import torch

from nwor_lab import exercises
from nwor_lab.viz import frame_figure
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.tree import commit_strips, tree_costs_figure, tree_figure, tree_layout, tree_vs_chain_figure
from nwor_lab.viz.tree_frames import STRATEGY_TITLES, tree_demo, tree_frames

DEMO = tree_demo(0)


def after_commit(strategy):
    frames = tree_frames(strategy, DEMO)
    assert [f.phase for f in frames] == ["begin", "write", "write", "acceptance", "commit"]
    f = frames[-1]
    grid = f.grid().reshape(-1)
    return f, [SlotState(int(grid[s])) for s in f.region_slots], [f.marks.get(s, "") for s in f.region_slots]


def test_each_strategy_leaves_the_positions_past_the_path_as_it_declares():
    f, states, marks = after_commit("stage")
    a = sum(f.acceptance.draft_mask.tolist())
    assert a == 2 and len(states) == len(DEMO.parents) + 1
    path = [i + 1 for i, p in enumerate(f.acceptance.draft_mask.tolist()) if p]
    # t_last and the path, compacted to n .. n + a: the same in every strategy but remap
    assert marks[:a + 1] == ["t"] + [f"n{i}✓" for i in path]
    assert states[:a + 1] == [SlotState.COMMITTED] * (a + 1) and states[a + 1:] == [SlotState.EMPTY] * (len(states) - a - 1)
    _, states, marks = after_commit("cow")
    assert states[a + 1:] == [SlotState.RESTORED] * (len(states) - a - 1) and marks[:a + 1][-1] == f"n{path[-1]}✓"
    _, states, marks = after_commit("move")
    assert states[:a + 1] == [SlotState.COMMITTED] * (a + 1)
    assert set(states[a + 1:]) == {SlotState.REJECTED}        # rejected nodes and the moved node's stale copy
    assert f"n{path[-1]}✓" in marks[a + 1:]                    # the stale copy at its write-all slot
    _, states, marks = after_commit("remap")                  # block size 1: nothing moves, rejected slots freed
    assert [m.rstrip("✓✗") for m in marks] == ["t"] + [f"n{j}" for j in range(1, len(states))]
    assert [s == SlotState.COMMITTED for s in states] == [True] + f.acceptance.draft_mask.tolist()


def test_the_figures_build():
    final = {STRATEGY_TITLES[s]: tree_frames(s, DEMO)[-1] for s in ("move", "stage")}
    rows = [{"strategy": n, "rows_written_per_token": 1.0 + i, "bytes_moved": 1024 * i, "stranded_bytes": 0,
             "commit_share": 0.01} for i, n in enumerate(("write-all+move", "stage"))]
    chain = {"rows": [{"drafter": d, "nodes": 4, "depth": depth, "mean_acceptance_length": 2.5, "draft_rows_per_step": 3}
                      for d, depth in (("chain", 4), ("tree", 4), ("tree", 3))]}
    for fig in (tree_figure(DEMO.parents, None, None), tree_figure(DEMO.parents, None, [True] + [False] * 8),
                commit_strips(final), tree_costs_figure(rows), tree_vs_chain_figure(chain),
                frame_figure(tree_frames("cow", DEMO)[-1])):
        assert isinstance(fig, go.Figure)
        fig.to_json()
    x, y = tree_layout([0, 0, 1])
    assert x == [0, 1, 1, 2] and y[1] == y[3]                 # a single child sits level with its parent


def test_the_stepper_takes_tree_frames():
    pytest.importorskip("ipywidgets")
    from nwor_lab.viz import Stepper
    s = Stepper({"stage": tree_frames("stage", DEMO), "write-all+move": tree_frames("move", DEMO)})
    s.step(+4)
    assert "commit" in s.position.value and "one launch" in s.caption.value


def accepts_any_match(parents, draft_tokens, target_argmax, slots):
    # forgets that a node needs its parent accepted: takes every node whose token matches its parent's argmax
    hit = [i + 1 for i, p in enumerate(parents.tolist()) if int(draft_tokens[i]) == int(target_argmax[p])]
    path = torch.tensor(hit, dtype=torch.int64)
    return path, slots[path], slots[1:1 + len(hit)]


def dst_in_window_order(parents, draft_tokens, target_argmax, slots):
    path, src, _ = exercises.solutions.tree_commit_plan(parents, draft_tokens, target_argmax, slots)
    return path, src, src                                     # writes the path where write-all put it


@pytest.mark.parametrize("fn, note", [(accepts_any_match, "rejected parent"), (dst_in_window_order, "second child")])
def test_tree_commit_plan_checker_finds_the_usual_mistakes(fn, note):
    r = exercises.check("tree_commit_plan", fn, show=False)
    assert r.status == "fail" and note in r.message, r.message
    assert isinstance(r.figure, go.Figure)
