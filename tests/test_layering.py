"""No module imports upward: each sub-package imports only the ones below it (lazy imports too).

The order is the one docs/architecture.md gives; a new sub-package must be placed in it."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nwor_lab"
LAYERS = [
    {"config", "atomic", "lifeline"}, {"kv"}, {"_checks"}, {"ops"}, {"metrics", "window"}, {"tree"}, {"policies"},
    {"speculative"},
    {"model"}, {"engine"}, {"distributed"}, {"train"},
    {"bench", "selfcheck", "cli", "viz", "exercises", "sweep", "workshop", "why", "__init__", "__main__",
     "checkpoints"},
    {"vllm"},     # the vLLM plugin: the only package that imports vllm; nothing imports it
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
FRONT_ENDS = RANK["cli"]           # the front ends may import one another


def imports_of(path: Path) -> set[str]:
    """Sub-packages of nwor_lab that `path` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.split(".")[1] for n in names if n.startswith("nwor_lab.")}
    return out


def test_every_subpackage_has_a_layer():
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert tops <= set(RANK), f"place {sorted(tops - set(RANK))} in LAYERS (and docs/architecture.md)"


def test_no_module_imports_upward():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for imported in imports_of(path) - {top}:
            rank = RANK.get(imported, len(LAYERS))
            if rank > RANK[top] or (rank == RANK[top] and RANK[top] != FRONT_ENDS):
                upward.append(f"{path.relative_to(PACKAGE)} imports nwor_lab.{imported}")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_a_lazy_upward_import(tmp_path):
    bad = tmp_path / "mod.py"
    bad.write_text("def f():\n    from nwor_lab.speculative import ScvRunner\n")
    assert imports_of(bad) == {"speculative"}


def test_only_the_plugin_imports_vllm():
    """vLLM pins its own torch: the lab must import and run without it (nwor_lab.vllm is reached
    through vLLM's entry point, or `python -m nwor_lab.vllm` in vLLM's environment)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "vllm":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert not offenders, offenders
