"""The engine's step is written once (nwor_lab.engine.step.run_step): the eager path, the captured
path and the benchmarks run that one function, and no other module samples, accepts and commits a
verify window. A second implementation of the verify step fails here."""
import ast
from pathlib import Path

import nwor_lab.bench.step as bench_step
import nwor_lab.engine.runner as runner
import nwor_lab.engine.step as engine_step

PACKAGE = Path(engine_step.__file__).resolve().parents[1]
STEP = Path(engine_step.__file__).resolve()
# what only a verify step calls: the rejection sampler and the target forward with EAGLE's aux streams
STEP_CALLS = {"rejection_sample", "forward_with_aux"}


# Forwards that are no verify step, by (file, function): each samples nothing, accepts nothing and
# commits no window. The `recompute` head-cache strategy runs the target over a prefix-cache hit for its
# features alone (the head's K/V of the hit is rebuilt from them; the target K/V it writes into the
# private copies is replaced by the cached blocks' bits).
NOT_A_STEP = {("engine/prefix.py", "recompute_head"),
              # chapter 17 lays the sampler's decisions out on given logits: no target forward, no cache
              ("viz/sampling.py", "window_steps"), ("viz/sampling.py", "first_token_frequencies")}
# Parts of the one step, by (file, function): run_step asks its window kind for the verdict on a
# window of plain rows (a chain's, or any prefill's); nothing but the kinds' `accept` calls it.
STEP_PARTS = {("engine/window_chain.py", "accept_rows")}


def calls_in(path: Path, allowed: set = frozenset()) -> set[str]:
    """The STEP_CALLS made in `path`, except those inside a function named in `allowed`."""
    out = set()
    tree = ast.parse(path.read_text())
    skip = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name in allowed
            for n in ast.walk(fn)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in skip:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in STEP_CALLS:
                out.add(name)
    return out


def test_the_benchmarks_and_the_runner_run_the_engines_step():
    assert bench_step.run_step is engine_step.run_step
    assert runner.run_step is engine_step.run_step


def test_no_second_verify_step_in_the_package():
    """Only engine/step.py calls the sampler or the target's forward with aux streams (the models
    define it, their plain `forward` a thin wrapper; the sampler is defined in speculative/; the
    vLLM plugin runs vLLM's own step)."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.resolve() == STEP or path.relative_to(PACKAGE).parts[0] in ("model", "speculative", "vllm"):
            continue
        rel = str(path.relative_to(PACKAGE))
        found = calls_in(path, {fn for f, fn in NOT_A_STEP | STEP_PARTS if f == rel})
        if found:
            offenders[rel] = sorted(found)
    assert not offenders, f"a second verify step: {offenders}; run nwor_lab.engine.step.run_step instead"


def test_the_checker_sees_a_planted_step(tmp_path):
    bad = tmp_path / "mod.py"
    bad.write_text("def step(e, spec, logits):\n    return rejection_sample(spec, None, logits)\n")
    assert calls_in(bad) == {"rejection_sample"}
