"""A write policy added by one file (tests/toy_policy.py) and one `register_policy` line reaches every
front end without another edit: the CLI's `--nwor` choices (and a run of `nwor-lab generate --nwor toy`),
the benches' policy lists, and the engine, whose greedy tokens under it are target-only's; its
declared state counterpart is what `state_mode='auto'` runs on a hybrid target."""
import json

import pytest

from nwor_lab.config import LabConfig, nwor_modes
from nwor_lab.engine import generate
from nwor_lab.policies import POLICIES, register_policy

from toy_policy import ToyPolicy


@pytest.fixture(scope="module")
def toy():
    register_policy("toy", ToyPolicy)          # the one line
    yield "toy"
    POLICIES.pop("toy")


def test_the_cli_flags_offer_it(toy):
    from nwor_lab.cli.audit import add_parsers as audit_parsers
    from nwor_lab.commandline.errors import LabArgumentParser, UsageError
    from nwor_lab.commandline.generate_flags import parser
    assert parser().parse_args(["hi", "--nwor", toy]).nwor == toy
    top = LabArgumentParser(prog="nwor-lab")
    audit_parsers(top.add_subparsers(dest="command"))
    assert top.parse_args(["audit", "--nwor-mode", toy]).nwor_mode == toy
    POLICIES.pop(toy)
    try:
        with pytest.raises(UsageError, match="invalid choice: 'toy'"):
            parser().parse_args(["hi", "--nwor", toy])     # unregistered: no longer a choice
    finally:
        register_policy(toy, ToyPolicy)


def test_the_benches_list_it(toy):
    from nwor_lab.bench.engine8b import parser as engine8b_parser
    from nwor_lab.bench.ring import ring_strategies
    assert toy in engine8b_parser().parse_args([]).policies      # default: every registered policy
    # write-all: a ring of W slots is not exact under it, so the ring bench runs it under every fix too
    assert [r for m, r in ring_strategies() if m == toy] == ["ring", "slack", "full", "guard"]
    assert nwor_modes()[-1] == toy


def test_generate_on_the_command_line(toy, capsys):
    from nwor_lab.cli import main
    assert main(["generate", "def f(x):", "--k", "3", "--nwor", toy, "--max-new-tokens", "8", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["strategy"] == toy


def test_the_engine_decodes_target_only_tokens(toy):
    from nwor_lab.model.toy import toy_pair
    target, head = toy_pair(0)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    ref = generate(prompts, max_new_tokens=10, k=0, target=target, head=head).token_ids
    res = generate(prompts, max_new_tokens=10, k=3, config=LabConfig(nwor_mode=toy, debug=True),
                   target=target, head=head)
    assert res.token_ids == ref and type(res.engine.policy) is ToyPolicy
    s = res.engine.metrics.summary()[toy]          # windows recorded under its name, some drafts rejected
    assert s["windows"] > 0 and s["accepted"] < s["drafts"]


def test_its_declared_state_counterpart_runs_beside_it(toy):
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    target, head = hybrid_pair()
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    ref = generate(prompts, max_new_tokens=8, k=0, target=target, head=head).token_ids
    res = generate(prompts, max_new_tokens=8, k=3, config=LabConfig(nwor_mode=toy), target=target, head=head)
    assert res.engine.states.name == "snapshots" and res.kv["state_mode"] == "snapshots"
    assert res.token_ids == ref


def test_no_counterpart_on_a_hybrid_target_asks_for_a_state_mode():
    from nwor_lab.bench.state import toy_pair as hybrid_pair
    from nwor_lab.policies import OffPolicy

    class Plain(OffPolicy):
        state_counterpart = None
    register_policy("plain", Plain)
    try:
        target, head = hybrid_pair()
        with pytest.raises(ValueError, match=r"state_mode='auto': the write policy nwor_mode='plain' declares no "
                                             r"state counterpart .*set LabConfig.state_mode"):
            generate([[1, 2]], max_new_tokens=2, k=2, config=LabConfig(nwor_mode="plain"), target=target, head=head)
        res = generate([[1, 2]], max_new_tokens=2, k=2, config=LabConfig(nwor_mode="plain", state_mode="cow"),
                       target=target, head=head)
        assert res.engine.states.name == "cow"
    finally:
        POLICIES.pop("plain")
