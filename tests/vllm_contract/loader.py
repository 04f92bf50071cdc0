"""Import the few vLLM modules the contract runs, from the extracted wheel, without installing vLLM.

    load(src) -> VllmParts     vLLM's own RejectionSampler, Sampler, SamplingMetadata,
                               SpecDecodeMetadata, rejection_sampler module and
                               GPUModelRunner._calc_spec_decode_metadata (as a function)

Real vLLM code (run as shipped): vllm/v1/sample/{rejection_sampler, sampler, metadata}.py,
vllm/v1/sample/ops/{topk_topp_sampler, bad_words}.py, vllm/v1/spec_decode/{metadata, fly}.py,
vllm/model_executor/warmup/jit_warmup{, _triton_helper}.py (the Triton dispatcher that launches the
rejection kernels), and, cut out of their 7,000-line files with `ast`, the runner methods
`_calc_spec_decode_metadata`, `_get_cumsum_and_arange` and `vllm.utils.torch_utils.async_tensor_h2d`.

Stand-ins (`STUBS`), for imports those files make but the contract never executes: logging,
env flags (defaults), a platform that is neither CUDA, ROCm, XPU nor CPU (so the sampler takes its
PyTorch-native path: `random_sample`, an exponential race, exactly what runs on CUDA when
FlashInfer's sampler is off), ROCm's aiter (disabled), logits processors and penalties (none in
the batches), the output containers, and the top-k/top-p Triton module (top-k/top-p unused).
Any other `vllm.*` import raises, naming the module, so a new vLLM version fails loudly here.

Triton kernels run under the CPU interpreter, which needs TRITON_INTERPRET=1 in the environment
before triton is first imported (triton.language's own jit helpers, e.g. tl.zeros, are made at
that import). So the contract runs vLLM in a subprocess (`worker.py`) that sets it first; `load`
refuses to run otherwise. Afterwards every `vllm*` entry is removed from sys.modules again (and
any pre-existing one restored): the loaded functions keep their own globals.
"""
from __future__ import annotations

import ast
import contextlib
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

REAL = (
    "vllm.v1.spec_decode.metadata",
    "vllm.v1.spec_decode.fly",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.metadata",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.sample.ops.bad_words",
    "vllm.model_executor.warmup.jit_warmup",
    "vllm.model_executor.warmup.jit_warmup_triton_helper",
)


# -- stand-ins -----------------------------------------------------------------------------------
class _Platform:
    """Not CUDA, ROCm, XPU or CPU: vLLM then picks its PyTorch-native sampling paths."""
    device_type = "cpu"
    simple_compile_backend = "eager"

    def __getattr__(self, name: str):
        if name.startswith("is_"):
            return lambda *a, **k: False
        raise AttributeError(f"contract stub platform has no {name!r}")


class _CpuArchEnum(enum.Enum):
    X86 = "x86"
    ARM = "arm"
    POWERPC = "powerpc"
    RISCV = "riscv"
    OTHER = "other"


class _AiterOps:
    @staticmethod
    def is_enabled() -> bool:
        return False


class _Envs(types.ModuleType):
    """vllm.envs with the defaults of the flags these files read."""
    VLLM_TRITON_JIT_WARMUP_NUM_THREADS = 1
    VLLM_BATCH_INVARIANT = False
    VLLM_USE_FLASHINFER_SAMPLER = False
    VLLM_XPU_USE_SAMPLER_KERNEL = False
    VLLM_TRITON_FORCE_FIRST_CONFIG = False

    @staticmethod
    def is_set(name: str) -> bool:
        return False


class _Unused:
    """A name imported for a path the contract never takes: any use raises."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *a, **k):
        raise RuntimeError(f"contract harness: {self._name} is a stand-in and was not expected to run")

    def register_warmup(self, *a, **k) -> None:       # top-k/top-p kernels register at import
        return None


class _MinTokensLogitsProcessor:                      # only an isinstance() target
    pass


class LogprobsTensors(NamedTuple):                    # vllm/v1/outputs.py, same fields
    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor


class LogprobsLists(NamedTuple):
    logprob_token_ids: np.ndarray
    logprobs: np.ndarray
    sampled_token_ranks: np.ndarray


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _stubs() -> dict[str, types.ModuleType]:
    import triton
    import triton.language as tl

    envs = _Envs("vllm.envs")
    return {
        "vllm.envs": envs,
        "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
        "vllm.platforms": _module("vllm.platforms", current_platform=_Platform(), CpuArchEnum=_CpuArchEnum),
        "vllm.platforms.interface": _module("vllm.platforms.interface", DeviceCapability=tuple),
        "vllm._aiter_ops": _module("vllm._aiter_ops", rocm_aiter_ops=_AiterOps()),
        "vllm.triton_utils": _module("vllm.triton_utils", HAS_TRITON=True, triton=triton, tl=tl),
        "vllm.config.model": _module(
            "vllm.config.model",
            LogprobsMode=Literal["raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"],
            PROCESSED_LOGPROBS_MODES=("processed_logits", "processed_logprobs")),
        "vllm.utils.torch_utils": _module("vllm.utils.torch_utils", PIN_MEMORY=False,
                                          async_tensor_h2d=_Unused("async_tensor_h2d"),
                                          make_tensor_with_pad=_Unused("make_tensor_with_pad")),
        "vllm.utils.gpu_sync_debug": _module("vllm.utils.gpu_sync_debug",
                                             gpu_sync_allowed=lambda **k: contextlib.nullcontext()),
        "vllm.v1.outputs": _module("vllm.v1.outputs", LogprobsTensors=LogprobsTensors, LogprobsLists=LogprobsLists,
                                   SamplerOutput=SamplerOutput),
        "vllm.v1.sample.logits_processor": _module("vllm.v1.sample.logits_processor", LogitsProcessors=object),
        "vllm.v1.sample.logits_processor.builtin": _module("vllm.v1.sample.logits_processor.builtin",
                                                           MinTokensLogitsProcessor=_MinTokensLogitsProcessor),
        "vllm.v1.sample.thinking_budget_state": _module("vllm.v1.sample.thinking_budget_state",
                                                        ThinkingBudgetStateHolder=object),
        "vllm.v1.sample.ops.penalties": _module("vllm.v1.sample.ops.penalties",
                                                apply_all_penalties=_Unused("apply_all_penalties")),
        "vllm.v1.sample.ops.logprobs": _module("vllm.v1.sample.ops.logprobs",
                                               batched_count_greater_than=_Unused("batched_count_greater_than")),
        "vllm.v1.sample.ops.topk_topp_triton": _module(
            "vllm.v1.sample.ops.topk_topp_triton",
            **{n: _Unused(n) for n in ("_topk_topp", "_topp_split_mask", "_topp_split_stats", "_topp_split_step",
                                       "apply_top_k_top_p_triton")}),
        "vllm.v1.spec_decode.utils": _module("vllm.v1.spec_decode.utils",
                                             unconditional_to_conditional_rates=_Unused("synthetic mode")),
    }


class _Finder(importlib.abc.MetaPathFinder):
    """Resolves `vllm.*`: real files from the wheel, stand-ins, or empty packages on the way."""

    def __init__(self, src: Path, stubs: dict[str, types.ModuleType]):
        self.src, self.stubs = src, stubs
        self.packages = {".".join(n.split(".")[:i]) for n in (*REAL, *stubs) for i in range(1, n.count(".") + 1)}

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in REAL:
            file = self.src / (fullname.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(fullname, file)
        if fullname in self.stubs:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(self.stubs[fullname]),
                                                  is_package=fullname in self.packages)
        if fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(_module(fullname)), is_package=True)
        raise ImportError(f"contract harness: {fullname} is imported by the vLLM files but neither loaded nor "
                          f"stubbed; add it to tests/vllm_contract/loader.py")


class _StubLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType):
        self.module = module

    def create_module(self, spec):
        self.module.__spec__ = spec
        if spec.submodule_search_locations is not None:
            self.module.__path__ = []
        return self.module

    def exec_module(self, module) -> None:
        return None


def _cut_functions(path: Path, names: tuple[str, ...], class_name: str | None) -> dict[str, str]:
    """Source of the named functions (methods of `class_name` when given) in a Python file."""
    tree = ast.parse(path.read_text())
    scope = tree.body
    if class_name is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    found = {n.name: ast.unparse(n) for n in scope if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = set(names) - set(found)
    if missing:
        raise RuntimeError(f"contract harness: {sorted(missing)} not found in {path}")
    return found


@dataclass
class VllmParts:
    version: str
    rejection_sampler: types.ModuleType      # vllm.v1.sample.rejection_sampler
    RejectionSampler: Any
    Sampler: Any
    SamplingMetadata: Any
    SpecDecodeMetadata: Any
    calc_spec_decode_metadata: Any           # (num_draft_tokens np, cu_num_scheduled_tokens np, input_ids) -> md


def _runner_metadata_fn(src: Path, SpecDecodeMetadata):
    """GPUModelRunner._calc_spec_decode_metadata, run on a minimal `self` (the buffers it reads)."""
    ns = {"np": np, "torch": torch, "SpecDecodeMetadata": SpecDecodeMetadata, "PIN_MEMORY": False}
    for code in _cut_functions(src / "vllm/utils/torch_utils.py", ("async_tensor_h2d",), None).values():
        exec(compile(code, "vllm/utils/torch_utils.py", "exec"), ns)
    methods = _cut_functions(src / "vllm/v1/worker/gpu_model_runner.py",
                             ("_calc_spec_decode_metadata", "_get_cumsum_and_arange"), "GPUModelRunner")
    for code in methods.values():
        exec(compile(code, "vllm/v1/worker/gpu_model_runner.py", "exec"), ns)

    class Runner:
        _calc_spec_decode_metadata = ns["_calc_spec_decode_metadata"]
        _get_cumsum_and_arange = ns["_get_cumsum_and_arange"]

        def __init__(self, input_ids: torch.Tensor, max_tokens: int):
            self.device = input_ids.device
            self.arange_np = np.arange(max_tokens + 1, dtype=np.int64)     # as the runner allocates them
            self._arange_scratch = np.empty(max_tokens + 1, dtype=np.int64)
            self.input_ids = types.SimpleNamespace(gpu=input_ids)

    def calc(num_draft_tokens: np.ndarray, cu_num_scheduled_tokens: np.ndarray, input_ids: torch.Tensor):
        return Runner(input_ids, int(cu_num_scheduled_tokens[-1]))._calc_spec_decode_metadata(
            num_draft_tokens, cu_num_scheduled_tokens)

    return calc


@contextlib.contextmanager
def _isolated_import(src: Path):
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for k in saved:
        del sys.modules[k]
    finder = _Finder(src, _stubs())
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def load(src: Path, version: str) -> VllmParts:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported (run vLLM through "
                           "tests/vllm_contract/worker.py)")
    with _isolated_import(src):
        import importlib
        rs = importlib.import_module("vllm.v1.sample.rejection_sampler")
        sampler = importlib.import_module("vllm.v1.sample.sampler")
        metadata = importlib.import_module("vllm.v1.sample.metadata")
        spec_md = importlib.import_module("vllm.v1.spec_decode.metadata")
    return VllmParts(version=version, rejection_sampler=rs, RejectionSampler=rs.RejectionSampler,
                     Sampler=sampler.Sampler, SamplingMetadata=metadata.SamplingMetadata,
                     SpecDecodeMetadata=spec_md.SpecDecodeMetadata,
                     calc_spec_decode_metadata=_runner_metadata_fn(src, spec_md.SpecDecodeMetadata))
