"""Harness that runs a few of vLLM's own modules, taken from its pinned wheel, next to the lab.

`wheel.py` fetches the wheel once (`pip download --no-deps`, checked against a pinned sha256,
cached under ~/.cache/nwor_lab/vllm-wheel or $NWOR_LAB_VLLM_WHEEL_DIR) and extracts only the
files the contract needs. `loader.py` imports those files under their real module names with
stand-ins for everything they import but the contract never runs (platform detection, logging,
ROCm/FlashInfer paths, logits processors), with Triton's CPU interpreter (TRITON_INTERPRET=1) for
their kernels. Nothing is installed and nothing stays in sys.modules afterwards.
"""
