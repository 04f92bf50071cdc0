"""GPU tests: CUDA kernels vs torch references (skipped without CUDA)."""
