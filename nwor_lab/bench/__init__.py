"""Benchmarks that need a GPU. `kernels`: the CUDA ops vs their torch references (µs, GB/s)."""
