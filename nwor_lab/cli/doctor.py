"""`nwor-lab doctor`: python, torch, CUDA, nvcc, which backend runs and why, and every setting.

`eager_steps` names each setting that keeps the engine's steps out of CUDA graphs.
Works whatever the environment holds: a bad value is reported (under `problems`), never raised.
A setting that was asked for but has no effect here (NWOR_LAB_BACKEND=cuda without CUDA, an
NWOR_LAB_* name nothing reads, TORCH_CUDA_ARCH_LIST while a GPU decides the arch) is listed
under `ignored`.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess

from nwor_lab.config import BACKENDS, ENV_BOOLS, ENV_CHOICES, ENV_INTS, ENV_TEXT, parse_bool

# Every NWOR_LAB_* variable something in the lab reads (config, the extension build, tests);
# a command that reads a new one adds it here, or doctor reports it as ignored.
BUILD_VARS = {"NWOR_LAB_CACHE_DIR": "extension build cache root",
              "NWOR_LAB_CSRC": "CUDA sources of the extension",
              "NWOR_LAB_VERBOSE_BUILD": "show the compiler (boolean)"}
OTHER_VARS = {"NWOR_LAB_SCV_GRAPH_FAIL": "tests: make every SCV graph capture fail",
              "NWOR_LAB_SANITIZE": "GPU tests: smaller case matrix under compute-sanitizer",
              "NWOR_LAB_METRICS_OUT": "where sweeps write metrics",
              "NWOR_LAB_OWNER": "set by a sweep on its workers and kernels (nwor_lab.lifeline: reaping)"}


def add_parsers(subparsers) -> None:
    d = subparsers.add_parser("doctor", help="python, torch, CUDA, nvcc, which backend runs and why, settings")
    d.add_argument("--backend", choices=BACKENDS, default=None)
    d.set_defaults(func=run)


def find_nvcc() -> tuple[str | None, str]:
    """-> (nvcc path or None, where it was looked for), the way the extension build looks: CUDA_HOME
    or CUDA_PATH, else /usr/local/cuda, else nvcc on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        nvcc = os.path.join(home, "bin", "nvcc")
        return (nvcc if os.path.isfile(nvcc) else None), f"CUDA_HOME={home}"
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda/bin/nvcc", "/usr/local/cuda"
    return shutil.which("nvcc"), "PATH"


def settings_report(cli_backend: str | None = None, environ=None) -> tuple[dict, list[str], list[str], str]:
    """-> (settings {var: {value, status}}, problems, ignored, the backend choice in effect)."""
    env = os.environ if environ is None else environ
    settings, problems, ignored = {}, [], []
    backend_choice = cli_backend or "auto"
    for var, field, allowed in ENV_CHOICES:
        if var not in env:
            continue
        value = env[var].strip().lower()
        if value and value not in allowed():
            status = f"invalid: choose one of {', '.join(allowed())}"
            problems.append(f"{var}={env[var]!r}: {status}; commands that read it will refuse to run")
        else:
            status = f"sets LabConfig.{field}"
            if field == "backend" and value and cli_backend is None:
                backend_choice = value
        settings[var] = {"value": env[var], "status": status}
    for var, field in ENV_BOOLS + (("NWOR_LAB_VERBOSE_BUILD", None),):
        if var not in env:
            continue
        try:
            parse_bool(var, env[var])
            status = f"sets LabConfig.{field}" if field else BUILD_VARS[var]
        except ValueError as err:
            status = "invalid"
            problems.append(f"{err}; commands that read it will refuse to run")
        settings[var] = {"value": env[var], "status": status}
    for var, field in ENV_INTS:
        if var not in env:
            continue
        status = f"sets LabConfig.{field}"
        if env[var].strip() and not env[var].strip().isdigit():
            status = "invalid: expected an integer >= 0"
            problems.append(f"{var}={env[var]!r}: {status}; commands that read it will refuse to run")
        settings[var] = {"value": env[var], "status": status}
    for var, field, parse in ENV_TEXT:          # each text field read by its own parser, as from_env does
        if var not in env:
            continue
        status = f"sets LabConfig.{field}"
        try:
            parse(var, env[var])
        except (ValueError, TypeError) as err:
            status = "invalid"
            problems.append(f"{err}; commands that read it will refuse to run")
        settings[var] = {"value": env[var], "status": status}
    known = ({v for v, _, _ in ENV_CHOICES} | {v for v, _ in ENV_BOOLS} | {v for v, _ in ENV_INTS}
             | {v for v, _, _ in ENV_TEXT} | set(BUILD_VARS)
             | set(OTHER_VARS))
    for var in sorted(env):
        if var.startswith("NWOR_LAB_") and var not in known:
            settings[var] = {"value": env[var], "status": "ignored: nothing in nwor_lab reads it"}
            ignored.append(f"{var}: nothing in nwor_lab reads it (a typo? known: {', '.join(sorted(known))})")
        elif var in BUILD_VARS and var not in settings or var in OTHER_VARS:
            settings[var] = {"value": env[var], "status": BUILD_VARS.get(var) or OTHER_VARS[var]}
    csrc = env.get("NWOR_LAB_CSRC")
    if csrc and not os.path.isdir(csrc):
        problems.append(f"NWOR_LAB_CSRC={csrc}: no such folder; the CUDA extension cannot build from it")
    home = env.get("CUDA_HOME")
    if home and not os.path.isfile(os.path.join(home, "bin", "nvcc")):
        problems.append(f"CUDA_HOME={home}: has no bin/nvcc; the CUDA extension cannot build (fix or unset it)")
    return settings, problems, ignored, backend_choice


def report(cli_backend: str | None = None) -> dict:
    """Everything doctor prints, as a dict; never raises."""
    out = {"nwor_lab": None, "python": platform.python_version()}
    settings, problems, ignored, choice = settings_report(cli_backend)
    try:
        import nwor_lab
        import torch

        cuda = torch.cuda.is_available()
        out.update(nwor_lab=nwor_lab.__version__, torch=torch.__version__, torch_cuda=torch.version.cuda,
                   cuda_available=cuda, gpu=torch.cuda.get_device_name(0) if cuda else None)
    except Exception as err:  # noqa: BLE001 - doctor reports, never fails
        cuda = False
        problems.append(f"importing torch failed: {type(err).__name__}: {err}")
    nvcc, looked = find_nvcc()
    nvcc_version = None
    if nvcc:
        try:
            text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            nvcc_version = text.strip().splitlines()[-1] if text.strip() else None
        except (OSError, subprocess.SubprocessError) as err:
            nvcc_version = f"failed: {err}"
    out.update(nvcc=nvcc, nvcc_version=nvcc_version, nvcc_looked_in=looked, CUDA_HOME=os.environ.get("CUDA_HOME"))
    try:
        from nwor_lab.ops.backend import backend

        info = backend(None, choice)
        out.update(backend=info.name, backend_reason=info.reason)
    except Exception as err:  # noqa: BLE001
        out.update(backend=None, backend_reason=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        problems.append(f"backend {choice!r}: {out['backend_reason']}")
    if choice == "cuda" and not cuda:
        source = "--backend cuda" if cli_backend else "NWOR_LAB_BACKEND=cuda"
        ignored.append(f"{source}: CUDA is not available here, so every op would run the torch reference; "
                       f"generate and selfcheck refuse it (use auto or torch)")
    if cuda and os.environ.get("TORCH_CUDA_ARCH_LIST"):
        ignored.append(f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}: the extension is built for "
                       f"the visible GPU's architecture instead")
    out.update(settings=settings, ignored=ignored, eager_steps=eager_settings(), problems=problems)
    return out


def eager_settings(environ=None) -> list[str]:
    """The NWOR_LAB_* settings that keep the engine's steps out of CUDA graphs, one line each (what
    `SpecEngine.graphed_off` would name; an invalid value is a problem elsewhere, not listed here)."""
    from nwor_lab.config import LabConfig
    try:
        cfg = LabConfig.from_env(environ=os.environ if environ is None else environ)
    except (ValueError, TypeError):
        return []
    out = []
    if not cfg.cuda_graph:
        out.append("NWOR_LAB_CUDA_GRAPH=0: every step runs eagerly")
    if cfg.scv_mode == "off":
        out.append("NWOR_LAB_SCV_MODE=off: acceptance in a host loop, every step with drafts runs eagerly")
    if cfg.debug:
        out.append("NWOR_LAB_DEBUG=1: every step is checked on the host and runs eagerly")
    return out


def run(args) -> int:
    print(json.dumps(report(args.backend), indent=2))
    return 0
