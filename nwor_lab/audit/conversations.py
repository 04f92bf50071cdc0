"""A multi-turn workload with a shared system prompt and conversations that return: what makes
prefix hits happen (the auditor's prefix mode and `nwor-lab bench prefix` run it).

    conv = conversations(pair, num_conversations=3, turns=2, system_tokens=24, seed=0)
    turns = run_closed_loop(engine, conv, max_new_tokens=8)   # [(conversation, turn, Request)], in order

Closed loop: conversation 0's first turn runs alone (it computes and registers the system prompt);
then each turn of every conversation is submitted together, the next turn of a conversation only
once its previous reply is known: prompt = the previous turn's prompt + its reply + a new question.
A hit comes from the system prompt (every first turn after the first) and from the conversation's
own previous turn (every later turn: it hits blocks its own decode wrote).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# text for the shipped tokenizer (the pairs were trained on Python code)
SYSTEM_TEXT = ('"""You are a careful Python assistant. Answer with short, typed, tested functions.\n'
               'Prefer the standard library; explain nothing unless asked."""\nimport os\nimport sys\n\n')
QUESTIONS = ("def parse_args(argv):", "class Foo:", "def main():", "with open(path) as f:", "for i in range(",
             "return [x for x in", "if __name__ == ", "import os\n")


@dataclass(frozen=True)
class Conversations:
    """`system`: the shared system prompt's ids; `questions[c][t]`: conversation c's question at turn
    t (ids). Every prompt is the system prompt, then the conversation so far, then the question."""

    system: list[int]
    questions: list[list[list[int]]]
    seed: int

    @property
    def num_conversations(self) -> int:
        return len(self.questions)

    @property
    def turns(self) -> int:
        return len(self.questions[0]) if self.questions else 0

    def sizes(self) -> dict:
        """What a JSON states about the workload."""
        return {"conversations": self.num_conversations, "turns": self.turns, "system_tokens": len(self.system),
                "question_tokens": [[len(q) for q in c] for c in self.questions], "seed": self.seed}


def conversations(pair, num_conversations: int, turns: int, system_tokens: int, seed: int = 0) -> Conversations:
    """`num_conversations` conversations of `turns` turns. With a tokenizer: the system text (cut or
    repeated to `system_tokens` ids) and the code questions (conversation c's turn t asks question
    c + t, cycled); without one, seeded random ids (system prompt `system_tokens`, questions 3-6)."""
    if num_conversations < 1 or turns < 1 or system_tokens < 1:
        raise ValueError(f"num_conversations={num_conversations}, turns={turns}, system_tokens={system_tokens}: "
                         f"each must be >= 1")
    tok = getattr(pair, "tokenizer", None)
    if tok is not None:
        ids = tok.encode(SYSTEM_TEXT).ids
        system = (ids * (system_tokens // max(len(ids), 1) + 1))[:system_tokens]
        qs = [[tok.encode(QUESTIONS[(c + t) % len(QUESTIONS)]).ids for t in range(turns)]
              for c in range(num_conversations)]
        return Conversations(system, qs, seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = pair.target.config.vocab_size

    def ids(n):
        return torch.randint(1, vocab, (n,), generator=gen).tolist()
    system = ids(system_tokens)
    qs = [[ids(int(torch.randint(3, 7, (), generator=gen))) for _ in range(turns)] for _ in range(num_conversations)]
    return Conversations(system, qs, seed)


def run_closed_loop(engine, conv: Conversations, max_new_tokens: int, run=None) -> list[tuple]:
    """Run `conv` on `engine` (closed loop, see the module) -> [(conversation, turn, Request)] in
    submission order. `run(engine, requests)` runs each wave to its end (default `engine.run()`; a
    bench's clock steps it itself)."""
    out: list[tuple] = []
    last: dict[int, object] = {}
    waves = [[(0, 0)], [(c, 0) for c in range(1, conv.num_conversations)]]
    waves += [[(c, t) for c in range(conv.num_conversations)] for t in range(1, conv.turns)]
    for wave in waves:
        if not wave:
            continue
        reqs = []
        for c, t in wave:
            prev = last.get(c)
            head = conv.system if prev is None else prev.tokens
            r = engine.add_request(head + conv.questions[c][t], max_new_tokens)
            last[c] = r
            reqs.append(r)
            out.append((c, t, r))
        if run is None:
            engine.run()
        else:
            run(engine, reqs)
    return out
