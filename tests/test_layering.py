"""No module imports upward, and no modules import each other in a circle (lazy imports too).

Upward: each sub-package imports only the ones below it in LAYERS, every front end in a layer of its
own, so that the front ends too stand on one another in one order. The order is the one
docs/architecture.md gives; a new sub-package must be placed in it.
Circles: over the modules of nwor_lab (an import of a sub-module, `from nwor_lab.x import y` with y
a module, is an arrow to that module, not to the package's __init__), no loop of imports at all."""
import ast
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nwor_lab"
LAYERS = [
    {"config", "atomic", "lifeline"}, {"__init__"}, {"kv"}, {"_checks"}, {"ops"}, {"metrics", "window"},
    {"policies", "state"}, {"speculative"}, {"model"}, {"engine"}, {"distributed"}, {"disagg"},
    # the front ends, each on the ones below it
    {"audit"},         # the store-by-store auditor: runs the engine, checks every store's bytes
    {"commandline"},   # what every command line shares: flag types, the one error path, lab_config
    {"train"}, {"serve"}, {"selfcheck"}, {"why"}, {"viz"}, {"bench"}, {"exercises"},
    {"sweep"},         # papermill sweeps: the notebooks' contract (parameters cell in, metrics out)
    {"workshop"},      # the kit, built from the chapters through the sweep's contract
    {"cli"},           # the `nwor-lab` command: dispatches to the front ends above; nothing imports it
    {"vllm"},          # the vLLM plugin: the only package that imports vllm; nothing imports it
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for all the checks (keyed by its text: a file that changes
    is parsed again)."""
    return _parse(path.read_text())


@cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def imports_of(path: Path) -> set[str]:
    """Sub-packages of nwor_lab that `path` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(parsed(path)):
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
            if RANK.get(imported, len(LAYERS)) >= RANK[top]:
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
        for node in ast.walk(parsed(path)):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert not offenders, offenders


def module_name(path: Path, root: Path) -> str:
    """`root/pkg/sub/mod.py` -> "pkg.sub.mod"; a package's `__init__.py` -> the package's name."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, anywhere in the file (lazy and TYPE_CHECKING
    imports too). `from a.b import c` is an arrow to the module a.b.c when there is one, else to a.b."""
    root = package.parent
    files = {module_name(p, root): p for p in package.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:                      # relative: from the importing module's package
                    parent = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                    if target in files:
                        out.add(target)
        graph[name] = out - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(circle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(circle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in circle)


def test_no_modules_import_each_other_in_a_circle():
    graph = module_graph(PACKAGE)
    found = circles(graph)
    assert not found, "import circles (break each: move what both need into a module of its own):\n" + \
        "\n".join(describe(c, graph) for c in found)


def test_the_checker_sees_a_planted_circle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "a.py": "from pkg.sub import b\n",                          # a sub-module named in a from-import
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from pkg import c\n",           # lazy, inside a function
        "c.py": "from . import a\nimport pkg.d\n",                  # relative, back to a: a -> b -> c -> a
        "d.py": "from pkg.sub.b import f\n",                        # d -> b, but nothing leads back to d
    }.items():
        (pkg / name).write_text(text)
    graph = module_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a", "pkg.d"} and graph["pkg.d"] == {"pkg.sub.b"}
    assert circles(graph) == [["pkg.a", "pkg.c", "pkg.d", "pkg.sub.b"]]
    (pkg / "d.py").write_text("")
    assert circles(module_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("import pkg.d\n")
    assert circles(module_graph(pkg)) == []
