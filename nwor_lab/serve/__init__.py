"""Serving in wall-clock time: arrivals, the step loop, latency metrics and an adaptive draft count.

  workload    request specs (prompt, output length) from fixed-seed length distributions; Poisson
              arrival times (open loop)
  driver      `serve(engine, specs, ...)`: the engine stepped in wall-clock time, open loop
              (requests arrive at their times) or closed loop (N clients, each finished request
              replaced at once) -> a ServeRun (per-request token times, per-step records)
  metrics     TTFT / TPOT / ITL / E2EL percentiles, throughput and goodput, named and defined as
              vLLM's benchmarks/benchmark_serving.py and SGLang's bench_serving define them
  adaptive    AdaptiveK: each step's draft count (0..k) from the batch size, the measured acceptance
              per position and an online cost model of the step (the engine's `draft_counts` hook)
  phases      a workload whose forced acceptance switches profile mid-run (high, low, high) at
              stated shares of a run's output tokens: `bench serve --phases`
  simulate    AdaptiveK offline: fed by a step-cost model (the H200 runs' step times, the runner's
              pre-launch rule) and an acceptance profile or phase schedule, against every fixed k

The package drives the engine through its public API only (add_request, step, scheduler, trace).
"""
from nwor_lab.serve.adaptive import AdaptiveK
from nwor_lab.serve.driver import ServeRun, serve
from nwor_lab.serve.metrics import Slo, summarize
from nwor_lab.serve.workload import RequestSpec, poisson_arrivals, sample_lengths

__all__ = ["AdaptiveK", "ServeRun", "serve", "Slo", "summarize", "RequestSpec", "poisson_arrivals", "sample_lengths"]
