"""docs/check_typeset.py's reading of a rendered page (the browser part runs by hand,
`make docs-typeset`: CI's machines have no Chromium)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "docs" / "check_typeset.py"
_spec = importlib.util.spec_from_file_location("check_typeset", _path)
check_typeset = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_typeset)

TYPESET = '<p>The gain <mjx-container class="MathJax"><svg></svg></mjx-container> grows.</p>'


def test_typeset_math_passes_and_raw_tex_fails():
    assert check_typeset.check("p", TYPESET, expects_math=True) is None
    raw = "<p>The gain $\\hat{A}_i$ grows and \\(x_{t}\\) too.</p>"
    why = check_typeset.check("p", raw, expects_math=True)
    assert why is not None and "$\\hat{A}_i$" in why
    assert check_typeset.raw_fragments("<p>a_{t} b^{2}</p>") == ["_{", "^{"]


def test_a_page_whose_source_has_math_must_show_typeset_math():
    plain = "<p>No formula here, 5 dollars and 6 dollars.</p>"
    assert check_typeset.check("p", plain, expects_math=False) is None
    assert "no typeset formula" in check_typeset.check("p", plain, expects_math=True)


def test_code_and_the_table_of_contents_are_not_read():
    dom = (
        "<pre>x = $a_{t}$</pre><code>y^{2}</code>"
        '<div class="highlight"><span>$z$</span></div>'
        '<div class="jp-TableOfContents-tree"><span>Step 2 · $\\mathbb{E}[x] = 0$</span></div>'
        + TYPESET
    )
    assert check_typeset.check("p", dom, expects_math=True) is None


def test_a_source_has_math_when_it_holds_a_dollar_pair():
    assert check_typeset.has_math("the weight $S$ of a prompt")
    assert not check_typeset.has_math("costs $5 and more")


def test_a_void_element_inside_code_does_not_hide_the_text_after_it():
    dom = "<pre>x<br>y</pre><p>raw $a_i$ after the code</p>"
    assert "$a_i$" in check_typeset.check("p", dom, expects_math=True)


def test_the_sites_hidden_copy_of_a_code_cell_is_not_read():
    dom = '<div class="clipboard-copy-txt"># E_{a∼π}[r]</div>' + TYPESET
    assert check_typeset.check("p", dom, expects_math=True) is None


def test_math_in_code_is_not_math():
    assert not check_typeset.has_math("```\nprint(f'${x}$')\n```\nand `$a$` inline")
