"""The engine checks its config once and looks its write policy up once (`engine.choices.Choices`):
`prepare` hands its Choices to SpecEngine, which builds both policies from the class it was given;
`state_mode='auto'` follows the policy's declared counterpart, not its name."""
import pytest

from nwor_lab.config import LabConfig
from nwor_lab.engine import SpecEngine, choices
from nwor_lab.engine.generate import prepare
from nwor_lab.model.toy import toy_pair
from nwor_lab.policies import POLICIES


@pytest.fixture
def lookups(monkeypatch):
    calls = []
    real_lookup, real_check = choices.policy_class, choices.check_config

    def lookup(config):
        calls.append("policy_class")
        return real_lookup(config)

    def check(name, config):
        calls.append("check_config")
        return real_check(name, config)
    monkeypatch.setattr(choices, "policy_class", lookup)
    monkeypatch.setattr(choices, "check_config", check)
    return calls


def test_prepare_and_the_engine_look_the_config_up_once(lookups):
    target, head = toy_pair(0)
    gen = prepare([[1, 2, 3]], 4, 3, LabConfig(nwor_mode="cow"), target=target, head=head)
    assert lookups == ["check_config", "policy_class"]
    assert type(gen.engine.policy) is POLICIES["cow"] is type(gen.engine.drafter.policy)
    lookups.clear()
    SpecEngine(target, head, LabConfig(nwor_mode="stage"), k=2, num_blocks=8)
    assert lookups == ["check_config", "policy_class"]


def test_a_bad_config_is_still_named():
    target, head = toy_pair(0)
    with pytest.raises(TypeError, match=r"config='stage': expected a nwor_lab.LabConfig.*LabConfig\(nwor_mode='stage'\)"):
        SpecEngine(target, head, "stage")
    with pytest.raises(TypeError, match="config='cow': expected a nwor_lab.LabConfig"):
        prepare([[1]], 2, 2, "cow", target=target, head=head)


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_auto_state_mode_is_the_declared_counterpart(mode):
    cfg = choices.Choices.of(LabConfig(nwor_mode=mode))
    assert cfg.state_config().state_mode == POLICIES[mode].state_counterpart == mode
    assert choices.Choices.of(cfg) is cfg
    assert choices.Choices.of(LabConfig(nwor_mode=mode, state_mode="replay")).state_config().state_mode == "replay"
