"""Run vLLM's metadata builder and rejection sampler on a list of cases, in a fresh process.

    TRITON_INTERPRET=1 python worker.py <vllm src root> <version> <cases.pt> <results.pt>

cases.pt holds a list of dicts (see tests/test_vllm_contract.py, `Case`); results.pt gets one dict
per case: vLLM's SpecDecodeMetadata fields and its sampled ids, plus the seconds spent.
A separate process because Triton's interpreter must be switched on before triton is imported.
"""
from __future__ import annotations

import os
import sys
import time
import types

os.environ["TRITON_INTERPRET"] = "1"            # before anything imports triton

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vllm_contract.loader import load  # noqa: E402

FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
          "bonus_logits_indices", "logits_indices")


def sampling_metadata(parts, temperature: torch.Tensor, seeds: dict[int, int]):
    """vLLM's SamplingMetadata for plain temperature sampling (no penalties, top-k/p, logprobs)."""
    r = temperature.shape[0]
    all_greedy = bool((temperature == 0).all())
    return parts.SamplingMetadata(
        temperature=None if all_greedy else temperature, all_greedy=all_greedy,
        all_random=bool((temperature > 0).all()), top_p=None, top_k=None,
        generators={i: torch.Generator().manual_seed(s) for i, s in seeds.items()}, max_num_logprobs=None,
        no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(r),
        presence_penalties=torch.zeros(r), repetition_penalties=torch.ones(r),
        output_token_ids=[[] for _ in range(r)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=types.SimpleNamespace(argmax_invariant=[], non_argmax_invariant=[]))


def run(parts, case: dict) -> dict:
    t0 = time.perf_counter()
    md = parts.calc_spec_decode_metadata(np.asarray(case["num_draft_tokens"], dtype=np.int32),
                                         np.asarray(case["cu_num_scheduled_tokens"], dtype=np.int32),
                                         case["input_ids"])
    out = {name: getattr(md, name) for name in FIELDS}
    out["num_draft_tokens"] = list(md.num_draft_tokens)
    if case.get("logits") is not None:
        sampler = parts.RejectionSampler(parts.Sampler())
        torch.manual_seed(case["global_seed"])           # requests without a seed use torch's default RNG
        sm = sampling_metadata(parts, case["temperature"], case["seeds"])
        res = sampler(md, case["draft_probs"], case["logits"].clone(), sm)
        out["sampled_token_ids"] = res.sampled_token_ids
    out["seconds"] = time.perf_counter() - t0
    return out


def main(src: str, version: str, cases_path: str, results_path: str) -> None:
    t0 = time.perf_counter()
    parts = load(__import__("pathlib").Path(src), version)
    load_s = time.perf_counter() - t0
    cases = torch.load(cases_path, weights_only=False)
    results = [run(parts, c) for c in cases]
    torch.save({"results": results, "load_seconds": load_s, "torch": torch.__version__}, results_path)


if __name__ == "__main__":
    main(*sys.argv[1:5])
