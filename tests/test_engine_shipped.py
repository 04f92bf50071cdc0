"""The shipped tiny pair: loads by default, speculative == target-only, acceptance >= 2.5 at k=4."""
import pytest

from nwor_lab.config import LabConfig
from nwor_lab.engine import generate
from nwor_lab.model import TINY_DIR, load_tiny

# Written for this test (not in the training corpus): held-out text for the acceptance check.
PROMPTS = [
    "def parse_header(line):\n    \"\"\"Split a header line into its name and value.\"\"\"\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\n\ndef walk_sizes(root):\n    total = 0\n    for dirpath, dirnames, filenames in os.walk(root):\n",
    "    if not isinstance(value, int):\n        raise TypeError(",
]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def test_shipped_pair_sizes(tiny):
    target, head, tok = tiny
    size = sum(p.stat().st_size for p in TINY_DIR.iterdir())
    assert size <= 20 * 2 ** 20
    assert sum(p.numel() for p in target.parameters()) <= 10_000_000
    assert head.config.hidden_size == target.config.hidden_size and tok.get_vocab_size() == target.config.vocab_size


def test_shipped_pair_accepts(tiny):
    target, head, tok = tiny
    ref = generate(PROMPTS, 32, k=0, target=target, head=head, tokenizer=tok)
    res = generate(PROMPTS, 32, k=4, config=LabConfig(nwor_mode="stage", scv_mode="graph"),
                   target=target, head=head, tokenizer=tok)
    assert res.token_ids == ref.token_ids
    assert res.texts == ref.texts and all(isinstance(t, str) and t for t in res.texts)
    assert res.mean_acceptance_length >= 2.5, res.summary()


def test_cli_generate(capsys):
    from nwor_lab.cli.generate import cli_generate
    assert cli_generate(["def area(r):\n", "--k", "4", "--nwor", "stage", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def area(r):\n") and "mean acceptance length" in out and "d1=" in out
    import json
    assert cli_generate(["x = 1\n", "--k", "2", "--nwor", "cow", "--scv", "graph", "--max-new-tokens", "6",
                         "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["nwor"] == "cow" and len(res["token_ids"][0]) == 6 and res["k"] == 2


def test_shipped_eagle3_head():
    target, head, tok = load_tiny(head="eagle3")
    assert head.aux_layers == (2, 4, 5) and head.draft_vocab_size == 1024
    ref = generate(PROMPTS[:2], 24, k=0, target=target, head=head, tokenizer=tok)
    res = generate(PROMPTS[:2], 24, k=4, config=LabConfig(nwor_mode="cow"), target=target, head=head, tokenizer=tok)
    assert res.token_ids == ref.token_ids
    assert res.mean_acceptance_length >= 2.0, res.summary()
    with pytest.raises(ValueError, match="shipped heads"):
        load_tiny(head="medusa")
