"""`--temperature` on every bench that builds an engine (`bench serve` has its own test): the
engines sample at it, the JSON records it, and a bad value is one clear error. CPU, tiny runs."""
import pytest
import torch

from nwor_lab.commandline.errors import UsageError


def test_bench_engine_samples_at_the_given_temperature(tmp_path):
    from nwor_lab.bench.engine import main
    hot = main(["--device", "cpu", "--prompts", "2", "--prompt-len", "8", "--new-tokens", "6", "--batch-sizes", "2",
                "--scv", "graph", "--no-hf", "--repeats", "1", "--temperature", "1.5", "--out", str(tmp_path / "e.json")])
    assert (tmp_path / "e.json").is_file()
    assert hot["temperature"] == 1.5
    assert all(r["same_tokens_as_target_only"] is None for r in hot["results"])     # sampled: not compared
    assert all(r["tokens_per_s"] > 0 for r in hot["results"])


def test_bench_engine_8b_mini_records_the_temperature():
    from nwor_lab.bench.engine import main
    out = main(["--model", "8b-mini", "--device", "cpu", "--dtype", "float32", "--ks", "2", "--batch-sizes", "1",
                "--new-tokens", "4", "--prompt-len", "8", "--repeats", "1", "--policies", "stage", "--no-hf",
                "--heads", "eagle1", "--no-components", "--temperature", "0.8"])
    assert out["temperature"] == 0.8 and len(out["results"]) == 2


@pytest.mark.parametrize("bench", ["nwor_lab.bench.engine", "nwor_lab.bench.step"])
def test_a_bad_temperature_is_refused_by_name(bench, capsys):
    import importlib
    main = importlib.import_module(bench).main
    with pytest.raises((SystemExit, UsageError)) as err:
        main(["--temperature", "-1"])
    assert "--temperature" in str(err.value) + capsys.readouterr().err


def test_bench_step_takes_the_temperature():
    """Its timing needs CUDA; the flag parses first, and its step samples at T > 0 (CPU, eager)."""
    from nwor_lab.bench.step import StepCase, main
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="needs a CUDA device"):
            main(["--temperature", "0.8"])
    from nwor_lab.model.toy import toy_pair
    with torch.no_grad():
        case = StepCase(toy_pair(0), batch=2, k=3, context=9, mode="stage", rate=0.5, attention="torch",
                        graphs=False, temperature=0.8)
        assert case.engine.temperature == 0.8 and case.exact.draft_probs is not None   # the sampled step
        first, second = case.eager()[0].clone(), case.eager()[0].clone()
    assert first.shape == second.shape == (2, 2 * 3 + 2)


def test_shuffled_repeats_take_every_case_once_in_a_seeded_order_of_their_own():
    from nwor_lab.bench.timing import in_order
    names = list("abcdef")
    orders = [in_order(names, i, "shuffle") for i in range(20)]
    assert all(sorted(o) == names for o in orders)
    assert orders == [in_order(names, i, "shuffle") for i in range(20)]          # seeded: the same every run
    assert len({tuple(o) for o in orders}) > 10                                  # not one fixed order
    # no pair of cases is always neighbours (what ABBA keeps: b always sits between a and c)
    assert any(abs(o.index("a") - o.index("b")) > 1 for o in orders)
    assert [in_order(names, i) for i in (0, 1)] == [names, names[::-1]]
    with pytest.raises(ValueError, match="order='random'"):
        in_order(names, 0, "random")
