"""binder/ (CPU only, Binder) and environment.yml (conda, GPU users) install what setup.py installs.

setup.py stays the one source of truth for dependencies; its lists are read here with `ast`
(no setup() run), and each mirror must name every package with the same version specifier,
and nothing setup.py does not know about.
"""
import ast
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONDA_ONLY = {"python", "pip", "ninja"}  # build tools conda provides; ninja is also in setup.py's dev extra


def _setup_keywords():
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords
            if k.arg in ("install_requires", "extras_require", "python_requires")}


def _by_name(lines):
    reqs = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r.specifier for r in reqs}


SETUP = _setup_keywords()
INSTALL = _by_name(SETUP["install_requires"])
DEV = _by_name(SETUP["extras_require"]["dev"])


def _binder():
    lines = [line.split("#")[0].strip() for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-")], lines


def _conda():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return env, conda, pip


def test_setup_lists_are_readable_without_running_setup():
    assert "torch" in INSTALL and "papermill" in INSTALL and "pytest" in DEV and "playwright" in DEV


def _mismatches(expected: dict, got: dict):
    missing = sorted(set(expected) - set(got))
    differ = sorted(f"{n}: setup.py {expected[n] or 'any'} vs {got[n] or 'any'}" for n in set(expected) & set(got)
                    if expected[n] != got[n])
    return missing, differ


def test_binder_installs_what_setup_py_installs_on_cpu():
    names, lines = _binder()
    binder = _by_name(names)
    missing, differ = _mismatches(INSTALL, binder)
    assert not missing, f"binder/requirements.txt lacks {missing}"
    assert not differ, differ
    assert set(binder) <= set(INSTALL), f"binder installs what setup.py does not: {sorted(set(binder) - set(INSTALL))}"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines, "CPU torch wheels on Binder"
    assert "vllm" not in binder


def test_binder_postbuild_installs_the_package_without_deps():
    post = ROOT / "binder" / "postBuild"
    assert post.stat().st_mode & 0o111, "postBuild must be executable"
    text = post.read_text()
    assert "pip install --no-deps -e ." in text and "set -e" in text


def test_conda_environment_installs_setup_py_and_dev():
    env, conda, pip = _conda()
    conda_names = {canonicalize_name(Requirement(d.split("=")[0]).name) for d in conda}
    got = _by_name(pip)
    missing, differ = _mismatches({**INSTALL, **DEV}, {**{n: SpecifierSet() for n in conda_names}, **got})
    assert not missing, f"environment.yml lacks {missing}"
    assert not differ, differ
    extra = set(got) | conda_names
    assert extra <= set(INSTALL) | set(DEV) | CONDA_ONLY, f"environment.yml installs {sorted(extra - set(INSTALL) - set(DEV) - CONDA_ONLY)}"
    python = next(d for d in conda if d.startswith("python"))
    assert SpecifierSet(SETUP["python_requires"]).contains(python.split("=")[1] + ".0"), python


@pytest.mark.parametrize("mirror", ["binder/requirements.txt", "environment.yml"])
def test_mirrors_say_where_they_come_from(mirror):
    assert "setup.py" in (ROOT / mirror).read_text() and "test_environments" in (ROOT / mirror).read_text()


def test_jupyterlab_has_the_widget_and_plotly_extensions():
    """The stepper needs these prebuilt extensions (they come in the pip wheels): without them
    JupyterLab shows "Error displaying widget" where the figure should be."""
    from jupyter_core.paths import jupyter_path
    found = {p.parent.relative_to(root).as_posix() for root in map(Path, jupyter_path("labextensions"))
             for p in root.glob("**/package.json") if "node_modules" not in p.parts}
    for name in ("@jupyter-widgets/jupyterlab-manager", "jupyterlab-plotly", "anywidget"):
        assert name in found, f"JupyterLab extension {name} is not installed (found {sorted(found)})"
