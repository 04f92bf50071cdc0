"""Prefix caching and preemption as LabConfig fields (`prefix_cache`, `preemption`), CPU, toy pair:
parsed and spelled canonically, read from NWOR_LAB_PREFIX_CACHE / NWOR_LAB_PREEMPTION, listed by
`nwor-lab doctor`, built into the engine when no keyword object is given; a keyword object wins over
a field at its default and contradicting a set field is refused naming both; the generate flags
write the fields. The engine's decoding under these settings is tests/test_prefix*.py's and
tests/test_preemption.py's; here only who decides.
"""
import dataclasses

import pytest

from nwor_lab.cli.doctor import settings_report
from nwor_lab.commandline.errors import UsageError
from nwor_lab.commandline.generate_flags import block_config, parser
from nwor_lab.config import PREEMPTION_MODES, PREFIX_CACHE_KEYS, LabConfig
from nwor_lab.engine import preemption as preemption_module
from nwor_lab.engine.preemption import Preemption
from nwor_lab.engine.prefix import PrefixCacheConfig
from conftest import toy_engine


@pytest.fixture(scope="module")
def pair(toy_eagle1_pair):
    return toy_eagle1_pair


def test_one_list_of_keys_and_modes():
    assert tuple(f.name for f in dataclasses.fields(PrefixCacheConfig)) == PREFIX_CACHE_KEYS
    assert preemption_module.PREEMPTION_MODES is PREEMPTION_MODES


@pytest.mark.parametrize("text,spelling", [("", ""), ("off", ""), ("on", "on"), (" ON ", "on"),
                                           ("offload=target_head, lookahead=drop_last",
                                            "lookahead=drop_last,offload=target_head"),
                                           ("host_blocks=64", "host_blocks=64")])
def test_prefix_cache_text_is_stored_in_its_canonical_spelling(text, spelling):
    assert LabConfig(prefix_cache=text).prefix_cache == spelling


@pytest.mark.parametrize("text,message", [
    ("yes", r"LabConfig.prefix_cache='yes': cannot read 'yes'; give \"\" \(off\), \"on\""),
    ("head=cached", r"cannot read 'head=cached'.*head_cache, lookahead, host_blocks, offload"),
    ("host_blocks=-1", r"host_blocks='-1': a number of host block slots"),
    ("lookahead=boundary,lookahead=drop_last", r"lookahead is given twice")])
def test_a_malformed_prefix_cache_names_the_field_and_the_form(text, message):
    with pytest.raises(ValueError, match=message):
        LabConfig(prefix_cache=text)


def test_bad_preemption_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"LabConfig.preemption='drop': choose one of recompute, swap"):
        LabConfig(preemption="drop")


def test_environment_overrides_and_doctor():
    env = {"NWOR_LAB_PREFIX_CACHE": "lookahead=drop_last", "NWOR_LAB_PREEMPTION": "swap"}
    cfg = LabConfig.from_env(environ=env)
    assert (cfg.prefix_cache, cfg.preemption) == ("lookahead=drop_last", "swap")
    with pytest.raises(ValueError, match=r"LabConfig.preemption='Drop' \(from NWOR_LAB_PREEMPTION\)"):
        LabConfig.from_env(environ={"NWOR_LAB_PREEMPTION": "Drop"})
    with pytest.raises(ValueError, match=r"LabConfig.prefix_cache \(from NWOR_LAB_PREFIX_CACHE\)='x=1'"):
        LabConfig.from_env(environ={"NWOR_LAB_PREFIX_CACHE": "x=1"})
    settings, problems, ignored, _ = settings_report(environ={**env, "NWOR_LAB_TREE": "topk=2"})
    assert settings["NWOR_LAB_PREFIX_CACHE"]["status"] == "sets LabConfig.prefix_cache"
    assert settings["NWOR_LAB_PREEMPTION"]["status"] == "sets LabConfig.preemption"
    assert settings["NWOR_LAB_TREE"]["status"] == "invalid" and not ignored
    assert len(problems) == 1 and problems[0].startswith("NWOR_LAB_TREE='topk=2': missing depth, nodes")


def test_the_engine_builds_its_settings_from_the_config(pair):
    e = toy_engine(pair, num_blocks=32, block_size=4,
                   cfg={"prefix_cache": "lookahead=drop_last,host_blocks=8", "preemption": "swap"})
    assert e.prefix.config == PrefixCacheConfig(lookahead="drop_last", host_blocks=8)
    assert e.prefix.host is not None and e.preemption == Preemption("swap")
    # the engine's config spells what runs, every key
    assert e.config.prefix_cache == "head_cache=cached,lookahead=drop_last,host_blocks=8,offload=target_head"
    off = toy_engine(pair, num_blocks=32, block_size=4)
    assert off.prefix is None and off.preemption == Preemption("recompute") and off.config.prefix_cache == ""


def test_a_bad_strategy_name_is_refused_when_the_engine_is_built(pair):
    cfg = LabConfig(prefix_cache="head_cache=lru")            # the form is right; the name is the registry's
    with pytest.raises(ValueError, match=r"LabConfig.prefix_cache='head_cache=lru': PrefixCacheConfig.head_cache="
                                         r"'lru': choose one of cached, missing, recompute"):
        toy_engine(pair, num_blocks=32, block_size=4, cfg={"prefix_cache": cfg.prefix_cache})


def test_a_keyword_wins_over_a_default_field_and_a_contradiction_is_refused(pair):
    kw = dict(num_blocks=32, block_size=4)
    e = toy_engine(pair, prefix_cache=PrefixCacheConfig(head_cache="missing"), preemption=Preemption("swap"), **kw)
    assert e.prefix.config.head_cache == "missing" and e.preemption.mode == "swap"
    assert e.config.prefix_cache.startswith("head_cache=missing,") and e.config.preemption == "swap"
    same = toy_engine(pair, cfg={"prefix_cache": "on", "preemption": "swap"}, prefix_cache=PrefixCacheConfig(),
                      preemption=Preemption("swap"), **kw)
    assert same.prefix.config == PrefixCacheConfig()
    with pytest.raises(ValueError, match=r"prefix_cache=PrefixCacheConfig\(head_cache='missing'.* contradicts "
                                         r"LabConfig.prefix_cache='on'"):
        toy_engine(pair, cfg={"prefix_cache": "on"}, prefix_cache=PrefixCacheConfig(head_cache="missing"), **kw)
    with pytest.raises(ValueError, match=r"preemption=Preemption\('recompute'\) contradicts LabConfig.preemption="
                                         r"'swap'"):
        toy_engine(pair, cfg={"preemption": "swap"}, preemption=Preemption("recompute"), **kw)
    with pytest.raises(TypeError, match=r"prefix_cache: expected a PrefixCacheConfig"):
        toy_engine(pair, prefix_cache="on", **kw)


def test_setting_the_engine_preemption_keeps_its_config_in_step(pair):
    e = toy_engine(pair, num_blocks=32, block_size=4)
    e.preemption = Preemption("swap")
    assert e.config.preemption == "swap"


def test_generate_flags_write_the_fields_over_the_environment():
    p = parser()
    env_cfg = LabConfig(prefix_cache="host_blocks=4", preemption="swap")
    cfg = block_config(p.parse_args(["hi", "--lookahead", "drop_last"]), env_cfg)
    assert cfg.prefix_cache == "lookahead=drop_last,host_blocks=4" and cfg.preemption == "swap"
    cfg = block_config(p.parse_args(["hi", "--prefix-cache", "--preemption", "recompute"]), LabConfig())
    assert cfg.prefix_cache == "on" and cfg.preemption == "recompute"
    assert block_config(p.parse_args(["hi"]), LabConfig()) == LabConfig()
    with pytest.raises(UsageError, match=r"--head-cache: a prefix-caching strategy; add --prefix-cache"):
        block_config(p.parse_args(["hi", "--head-cache", "missing"]), LabConfig())
