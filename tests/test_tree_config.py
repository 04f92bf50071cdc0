"""LabConfig.tree: parsed, checked with errors that name the field and the form, canonical spelling,
and the NWOR_LAB_TREE override for sweeps."""
import pytest

from nwor_lab.config import LabConfig, TreeShape


def test_dynamic_and_static_trees_parse():
    c = LabConfig(tree=" topk=4, depth=5,nodes=32")
    assert c.tree == "topk=4,depth=5,nodes=32"
    assert c.tree_shape == TreeShape(topk=4, depth=5, nodes=32)
    s = LabConfig(tree="paths=1|0|0.0|0.1").tree_shape
    assert s.paths == ((0,), (1,), (0, 0), (0, 1)) and s.is_static
    assert LabConfig(tree="chain").tree == "" and LabConfig().tree_shape is None


@pytest.mark.parametrize("text,match", [
    ("topk=4,depth=5", "missing nodes"),
    ("topk=4,depth=2,nodes=64", "at most 20 nodes"),
    ("topk=0,depth=2,nodes=1", "must be >= 1"),
    ("k=4,depth=2,nodes=3", "cannot read 'k=4'"),
    ("paths=0|1.0", "needs its parent 1 "),
    ("paths=0|a", "bad path 'a'"),
])
def test_bad_trees_name_the_field(text, match):
    with pytest.raises(ValueError, match=match) as err:
        LabConfig(tree=text)
    assert "LabConfig.tree" in str(err.value)


def test_env_override():
    c = LabConfig.from_env(environ={"NWOR_LAB_TREE": "topk=2,depth=3,nodes=8"})
    assert c.tree_shape.nodes == 8
    with pytest.raises(ValueError, match="from NWOR_LAB_TREE"):
        LabConfig.from_env(environ={"NWOR_LAB_TREE": "topk=2"})
