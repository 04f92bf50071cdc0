"""A CPU stand-in for the runner's CUDA graphs (tests only): what a captured bucket does to its
outputs, without a GPU. The real capture is tested in tests/gpu/."""
import nwor_lab.engine.runner as runner_mod


def graph_like(monkeypatch):
    """A CPU stand-in for CUDA graphs: the bucket's body runs once at capture, and every replay runs
    it again and copies its outputs into the first run's tensors (a graph's fixed output buffers,
    overwritten by each replay). Draws and cache writes happen once per step, as with a real graph."""
    real_step = runner_mod.run_step

    def run_step(e, inp):
        if inp.outputs is None:
            return real_step(e, inp)
        # a replay: a real one runs no Python, so the policies count no window (the host's `account` does)
        pols = [e.policy] + ([e.drafter.policy] if inp.drafts_next else [])
        counted = [p.windows_done for p in pols]
        out = real_step(e, inp)
        for p, n in zip(pols, counted):
            p.windows_done = n
        for dst, src in zip(inp.outputs, out):
            if dst is not None:
                dst.copy_(src)
        return inp.outputs

    class Graph:
        def __init__(self, fn):
            self.fn, self.fresh = fn, True

        def replay(self):
            if self.fresh:          # the capture's own run stands for its first replay
                self.fresh = False
                return
            self.fn()

    def capture_graph(fn, warmup=0, device=None, generators=(), pool=None):
        fn()
        return Graph(fn)
    monkeypatch.setattr(runner_mod, "run_step", run_step)
    monkeypatch.setattr(runner_mod, "graph_pool", lambda device: object())     # (a pool stands for nothing here)
    monkeypatch.setattr(runner_mod, "capture_graph", capture_graph)
