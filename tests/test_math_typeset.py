"""Formulas in the course notebooks' Markdown cells and in docs/*.md are typeset: written as LaTeX
between ``$…$`` (inline) or ``$$…$$`` (display) as JupyterLab's MathJax and GitHub render them,
not as raw text (``E_{a∼π_θ}``, ``A_i``, ``σ̂²``) that shows its underscores and braces and puts
the same symbol in two typefaces (issue 43 §2).

Outside math delimiters, code spans, code fences, link targets and HTML tags, a Markdown text has
no subscript or superscript written raw (``_{``, ``^{``, a one-letter or Greek symbol followed by
``_`` and its index, a Unicode sub- or superscript digit or letter) and no Greek letter: a Greek
letter in this course is always a symbol (π_θ the policy, ε the clip or the std floor, θ a
success rate), so it is typeset as one. Every ``$`` of a notebook cell or of a paragraph of a
page is paired, so that no formula runs on into the prose after it.

This file is self-checking: its own patterns are exercised on raw and typeset examples below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "notebooks" / "results").glob("*.ipynb")
)
DOCS = sorted((ROOT / "docs").glob("*.md"))

# Spans that are not prose: fenced code, inline code, display and inline math, link targets,
# HTML tags and bare URLs. Display math first, so that `$$…$$` is not read as two empty `$…$`.
NOT_PROSE = re.compile(
    r"```.*?```"  # code fence
    r"|`[^`\n]*(?:\n[^`\n]*)?`"  # code span (it may break across a line)
    r"|\$\$.+?\$\$"  # display math
    r"|(?<!\\)\$[^$\n]+?(?<!\\)\$"  # inline math
    r"|\]\([^)\s]*\)"  # link target
    r"|</?[A-Za-z][^>\n]*>"  # HTML tag (not `a < b > c`)
    r"|https?://\S+",
    re.S,
)
GREEK = "\u0391-\u03a9\u03b1-\u03c9\u03d1\u03d5\u03f5"
UNICODE_SCRIPTS = "\u00b2\u00b3\u00b9\u2070-\u209c\u1d62-\u1d6a\u2c7c"
RAW_MATH = re.compile(
    r"_\{|\^\{"  # braced sub- or superscript
    rf"|(?<![\w\\])[A-Za-z{GREEK}∇Σ]\u0302?_[A-Za-z0-9{GREEK}]"  # one-symbol base with an index
    rf"|[{UNICODE_SCRIPTS}]"  # Unicode sub- and superscripts
    rf"|[{GREEK}]"  # a Greek letter is a symbol
    r"|[\u0302\u0303\u0304ÂĀŜŨŪ]"  # a hat, tilde or bar on a symbol
    r"|(?<![\w*'’\\])[A-Za-z]\*(?![\w*])"  # a starred symbol (S*: Markdown eats the star)
)


INDENTED_CODE = re.compile(
    r"(?:^|(?<=\n\n))(?! *(?:[-*+]|\d+\.) )( {4,}\S[^\n]*(?:\n {4,}\S[^\n]*)*)(?=\n\n|\n?$)"
)


def prose(text: str) -> str:
    """A Markdown text without its code, math, link targets and tags (an indented code block is a
    paragraph all of whose lines are indented by four spaces or more and that is no list item)."""
    return NOT_PROSE.sub(" ", INDENTED_CODE.sub(" ", text))


def raw_math(text: str) -> list[str]:
    """The raw formula fragments of a Markdown text, each with some context."""
    bare = prose(text)
    return [
        bare[max(0, m.start() - 25) : m.end() + 25].replace("\n", " ")
        for m in RAW_MATH.finditer(bare)
    ]


def unpaired_dollars(text: str) -> bool:
    """Whether a Markdown text has a `$` that opens no formula or closes none (code excluded)."""
    bare = re.sub(r"```.*?```|`[^`\n]*(?:\n[^`\n]*)?`", " ", text, flags=re.S)
    bare = bare.replace(r"\$", "")
    if bare.count("$$") % 2:
        return True
    return bare.replace("$$", "").count("$") % 2 == 1


# rlkit verdicts' generated table (docs/results.md): its text is rlkit/verdicts.py's rendering,
# checked line by line against a fresh render (tests/test_verdicts.py), not prose written here
GENERATED = re.compile(r"^<!-- verdicts:begin -->$.*?^<!-- verdicts:end -->$", re.M | re.S)


def markdown_units(path: Path) -> list[tuple[str, str]]:
    """(where, text) for each notebook Markdown cell, or each paragraph of a page (split at blank
    lines outside code fences; a generated verdict table left out, its lines kept blank)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [
            (f"cell {index}", "".join(cell["source"]))
            for index, cell in enumerate(cells)
            if cell["cell_type"] == "markdown"
        ]
    units, current, fenced, start = [], [], False, 1
    text = GENERATED.sub(lambda m: "\n" * m.group().count("\n"), path.read_text(encoding="utf-8"))
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                units.append((f"line {start}", "\n".join(current)))
            current, start = [], number + 1
        else:
            current.append(line)
    if current:
        units.append((f"line {start}", "\n".join(current)))
    return units


FILES = NOTEBOOKS + DOCS


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_formulas_are_typeset(path):
    offenders = [
        f"{where}: …{fragment}…"
        for where, text in markdown_units(path)
        for fragment in raw_math(text)
    ]
    assert not offenders, f"{path.relative_to(ROOT)}: raw formula text outside $…$:\n" + "\n".join(
        offenders
    )


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_dollars_are_paired(path):
    offenders = [where for where, text in markdown_units(path) if unpaired_dollars(text)]
    assert not offenders, f"{path.relative_to(ROOT)}: an unpaired $ in {offenders}"


def test_the_checks_catch_raw_formulas_and_pass_typeset_ones():
    raw = [
        "J(θ) = E_{a∼π_θ}[r(a)]",
        "the advantage A_i of answer i",
        "S = (σ̂²/G)/(σ̂²/G + τ̂²)",
        "the std floor ε",
        "x^{2}",
        "π₀",
        "the estimate Ŝ",
        "| | < σ²/G | S* > 0 |",
        "the optimum S* and b*.",
        "    A_i = r_i - mean(r)\n- the list item A_i",
    ]
    for text in raw:
        assert raw_math(text), text
    typeset = [
        r"$J(\theta) = \mathbb{E}_{a\sim\pi_\theta}[r(a)]$",
        r"the advantage $A_i$ of answer $i$",
        r"$$S = \frac{\hat\sigma^2/G}{\hat\sigma^2/G + \hat\tau^2}$$",
        "the key `agpo.eps_low` and the file [x](a_b.md)",
        "```python\nA_i = r_i - r.mean()\n```",
        "Its code:\n\n    A_i = r_i - mean(r)\n    S_q = x\n\nafter.",
        "grpo_advantage and max_new_tokens are names, not formulas",
        r"the optimum $S^*$, *emphasis* and **bold**",
    ]
    for text in typeset:
        assert not raw_math(text), (text, raw_math(text))
    assert unpaired_dollars("costs $ 5") and unpaired_dollars("$$x$ and")
    assert not unpaired_dollars(r"$a$ and $$b$$, `$PWD`, \$5")


MATH = re.compile(r"\$\$.+?\$\$|(?<!\\)\$[^$\n]+?(?<!\\)\$", re.S)
# An exponent or index of more than one character needs braces; `\sqrt(x)` takes only the "(".
MALFORMED = re.compile(r"[\^_]\(|\\sqrt\(|\^\S\^|_[^\s{\\]_")


def malformed_math(text: str) -> list[str]:
    bare = re.sub(r"```.*?```|`[^`\n]*(?:\n[^`\n]*)?`", " ", text, flags=re.S)
    return [
        m.group()
        for m in MATH.finditer(bare)
        if m.group().count("{") != m.group().count("}") or MALFORMED.search(m.group())
    ]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_formulas_are_well_formed(path):
    offenders = [
        f"{where}: {math}" for where, text in markdown_units(path) for math in malformed_math(text)
    ]
    assert not offenders, f"{path.relative_to(ROOT)}: malformed LaTeX:\n" + "\n".join(offenders)


def test_the_well_formed_check_catches_a_bare_exponent():
    assert (
        malformed_math("$x^(a-1)$")
        and malformed_math(r"$\sqrt(k/12)$")
        and malformed_math("$S^*^2$")
    )
    assert not malformed_math(r"$x^{a-1}$, $x_{(k)}$, $\sqrt{k/12}$, $S^{*2}$, `x^(a)`")
