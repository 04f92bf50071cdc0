"""The number rule for chapter prose: every number with a unit in a chapter's markdown is either
rendered from the run or cited with its source.

- **Rendered**: the markdown is produced by a code cell from the chapter's variables (for example
  `display(Markdown(f"... {x:.1f} µs ..."))`) or the number is in a printed cell output. Neither is a
  markdown cell, so this scanner never sees them: a stored markdown cell holds no measured number of
  its own.
- **Cited**: the same paragraph names the number's source: a stored result
  (`benchmarks/results/<file>`, or a file name that exists in that folder or a path below it, e.g.
  `kernels_h200.json`, `tree_window_launch/warps8_h200.json`),
  a public URL, a pull request or issue of a named project ("vLLM #1234", "pull request #8",
  "PR #8"), or a paper ("arXiv:2401.15077", "Li et al.").

What counts as a number with a unit: a number (digits, optionally with `,` thousands, a decimal
point, a leading `~`, `≈`, `−`, or a range `a–b`) followed, with or without a space, by one of
`UNITS` (time: ns µs us ms s min minutes; `%`; bytes and rates: B KB MB GB TB KiB MiB GiB TiB, GB/s TB/s;
tok/s tokens/s; a multiplier × or x). A × or x followed by a number or "(" is a multiplication
("8 × 128", "3.35 × 0.37"), and so is a spaced × before a name ("2 × head_size"); neither counts.
"64× the bytes", "2.4×" and "0.66× `off`" are multipliers and do.
`B` and `s` count only after a space ("57,344 B", "30 s"), so "Llama-3.2-3B" and "1990s" do not.

A second rule covers what code cells render (`scan_verdicts`): a *verdict sentence* computed from a
run (one thing faster, slower, no slower, ahead of, beating another, or a crossover) names its scope
in the same sentence: graphed or eager, the device, the batch, the repeats, a stored file, or that it
is a demonstration.

A *paragraph* is a block of lines between blank lines, except that each item of a bulleted or
numbered list is its own paragraph (a citation in one bullet does not cover the next); a table is one
paragraph (cite its source in its header row, caption row or any cell). Fenced code blocks are
skipped (code, not prose); inline code is scanned.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

_NUM = r"(?<![\w.\-/])[~≈−-]?\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?"
UNITS = (r"ns", r"µs", r"us", r"ms", r"min", r"minutes?", r"%", r"KiB", r"MiB", r"GiB", r"TiB", r"KB", r"MB",
         r"GB/s", r"TB/s", r"GB", r"TB", r"tok/s", r"tokens/s")
_UNIT = re.compile(
    _NUM + r"(?:\s?(?:" + "|".join(UNITS) + r")(?![\w/])"        # 29 µs, 90%, 16 GB, 4.2 TB/s, 600 tok/s
    r"|\s(?:B|s)(?![\w/])"                                          # 57,344 B, 30 s
    r"|[×x](?![\w(])|\s[×x](?!\s*[\w(`])"                          # 2.4×, 64× the bytes (not 8 × 128, 2 × head_size)
    r")")
_URL = re.compile(r"https?://\S+")
_REF = re.compile(r"(?:\b(?:PR|pull\s+request|issue|vLLM|SGLang|TensorRT-LLM|llama\.cpp|[\w.-]+/[\w.-]+)\s*#\d+)"
                  r"|arXiv:\s?\d{4}\.\d{4,5}|\bet al\.", re.I)
_RESULT_FILE = re.compile(r"(?:benchmarks/results/)?([\w.-]+(?:/[\w.-]+)*\.(?:json|log|jsonl))")


@dataclass(frozen=True)
class Finding:
    cell: int                 # index of the markdown cell in the notebook
    number: str               # the number with its unit, as written
    paragraph: str            # the paragraph it sits in (first 160 characters)

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.number!r} in: {self.paragraph}"


def paragraphs(markdown: str) -> list[str]:
    """The markdown's paragraphs as the rule defines them (fenced code dropped, list items apart)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)
    out = []
    for block in re.split(r"\n\s*\n", text):
        items, current = [], []
        for line in block.splitlines():
            if re.match(r"^\s{0,3}(?:[-*+]|\d+[.)])\s", line) and current:
                items.append("\n".join(current))
                current = []
            current.append(line)
        if current:
            items.append("\n".join(current))
        out += [i for i in items if i.strip()]
    return out


def cited(paragraph: str, results: Path = RESULTS) -> bool:
    """The paragraph names a source: an existing stored result, a URL, a PR/issue, a paper."""
    if _URL.search(paragraph) or _REF.search(paragraph):
        return True
    return any((results / name).is_file() for name in _RESULT_FILE.findall(paragraph))


def numbers(paragraph: str) -> list[str]:
    return [m.group(0).strip() for m in _UNIT.finditer(paragraph)]


def scan_markdown(markdown: str, cell: int = 0, results: Path = RESULTS) -> list[Finding]:
    found = []
    for p in paragraphs(markdown):
        bare = numbers(p)
        if bare and not cited(p, results):
            short = " ".join(p.split())[:160]
            found += [Finding(cell, n, short) for n in bare]
    return found


def scan(nb, results: Path = RESULTS) -> list[Finding]:
    """Every number with a unit in the notebook's markdown cells that is neither rendered nor cited."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found += scan_markdown(cell.source, i, results)
    return found


# -- verdicts carry their scope ------------------------------------------------------------------
# A *verdict sentence* is one a code cell renders from a run that ranks or crosses over: something is
# faster, slower, wins, beats, or stops beating something else. One run on one machine under one
# regime does not make such a sentence true in general, so the sentence must say what it was measured
# on: the regime (graphed / eager / captured), the machine (CPU, GPU, a card, `device`), the batch,
# the repeats (median, runs, range, spread, noise), or that it is a demonstration or a stored run
# (a stored file's name). "at every measured point" alone is no scope: it says nothing of *which*.
_VERDICT = re.compile(r"\b(?:faster|slower|fastest|slowest|no slower|as fast|beats?|beating|crossover|outperforms?|"
                      r"ahead of)\b", re.I)
_SCOPE = re.compile(r"graph|eager|captur|\bCPU\b|\bGPU\b|\bH\d00\b|device|batch|repeat|median|\bruns?\b|range|spread|"
                    r"noise|demonstration|stored|\.json\b|\bN = |clients?\b|req/s|this machine", re.I)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+(?=[A-Z*`(])|\n\s*\n|\n-\s")


@dataclass(frozen=True)
class Unscoped:
    cell: int                 # index of the code cell
    sentence: str             # the verdict sentence, placeholders as {expression} (first 200 characters)

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.sentence}"


def _texts(source: str) -> list[str]:
    """The text each string expression of a code cell renders: implicit and `+` concatenations joined,
    f-string fields kept as `{expression}` (its source names what it holds: `{device}`, `{r['batch']}`);
    each branch of a conditional expression read on its own."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:              # IPython magics: nothing this rule can read
        return []

    def text(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                           for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            if left is not None or right is not None:
                return (left or "{…}") + (right or "{…}")
        return None

    out, inside = [], set()
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        t = text(node)
        if t is not None:
            out.append(t)
            inside.update(id(n) for n in ast.walk(node))
    return out


def verdict_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and _VERDICT.search(s) and len(s.split()) >= 4]


def unscoped(text: str) -> list[str]:
    """The verdict sentences of a rendered text that name no scope."""
    return [s for s in verdict_sentences(text) if not _SCOPE.search(s)]


def scan_verdicts(nb) -> list[Unscoped]:
    """Every verdict sentence a chapter's code cells render that does not say what it was measured on."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for t in _texts(cell.source):
                found += [Unscoped(i, " ".join(s.split())[:200]) for s in unscoped(t)]
    return found
