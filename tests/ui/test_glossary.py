"""The glossary and the equation numbers the page links to (ui/glossary.py), and the look-up script built from them
(ui/lookup.py): every term has one sentence, the numbers are docs/theory.md's headings, every number the code cites
is defined there, and the script never hands page text to the HTML parser."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ui import glossary
from ui.glossary import ALIASES, EXACT_CASE, GLOSSARY, THEORY_ANCHORS

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ["sink", "logit lens", "surprisal", "foil", "IOI", "resid_pre", "denoising", "noising",
            "integrated gradients", "completeness error", "nats", "Spearman's ρ", "SwiGLU", "GQA", "MQA", "KV cache",
            "RoPE", "ALiBi", "Pre-LN", "Post-LN", "RMSNorm", "induction head", "previous-token head",
            "logit difference", "activation patching", "residual stream", "d_k", "softmax", "causal mask",
            "padding mask", "cross-attention", "logit", "entropy", "one-hot", "prefill", "dtype", "bfloat16",
            "permutation-equivariant", "W^O", "K-composition", "relative score", "Sink^ε", "peak memory",
            "crossover length", "sparse attention", "linear attention"]
CITED_BY_LESSONS = ["2.2", "2.3", "2.4", "4.3", "5.5", "5.6", "5.7", "6.11", "6.12", "6.13"]


@pytest.mark.parametrize("term", REQUIRED)
def test_each_term_has_one_sentence(term):
    text = GLOSSARY[term].strip()
    assert len(text) > 30, (term, text)
    assert text.endswith("."), f"{term}: a definition is one full sentence, ending with a full stop: {text!r}"
    # one sentence: no full stop followed by a new capitalised sentence inside it
    assert not re.search(r"[.!?]\s+[A-Z]", text[:-1]), f"{term}: more than one sentence: {text!r}"


def test_aliases_and_exact_forms_name_real_terms():
    assert set(ALIASES.values()) <= set(GLOSSARY)
    assert not set(ALIASES) & set(GLOSSARY)
    assert EXACT_CASE <= set(GLOSSARY) | set(ALIASES)


def headings(text: str) -> list[str]:
    """The equation numbers of the "### eq. N.M — title" lines, read line by line (not with the module's regex)."""
    found = []
    for line in text.splitlines():
        if line.startswith("### eq. ") and " — " in line:
            found.append(line[len("### eq. "):].split(" — ")[0].strip())
    return found


def test_the_anchors_are_the_headings_of_docs_theory():
    text = (ROOT / "docs" / "theory.md").read_text(encoding="utf-8")
    assert list(THEORY_ANCHORS) == headings(text)
    assert len(set(THEORY_ANCHORS)) == len(THEORY_ANCHORS)
    assert set(CITED_BY_LESSONS) <= set(THEORY_ANCHORS)
    assert glossary.theory_anchors("### eq. 9.1 — a\nx\n### eqs. 9.2–9.3 — b\n### eq. 9.4 — c") == ("9.1", "9.4")


def test_every_equation_the_code_and_glossary_cite_is_defined():
    text = (ROOT / "docs" / "theory.md").read_text(encoding="utf-8")
    tags = set(re.findall(r"\((\d+\.\d+[a-d]?)\)\s*$", text, re.MULTILINE))  # "(6.1a)" at an equation's line end
    cited = {}
    for path in [*(ROOT / "ui").rglob("*.py"), *(ROOT / "core").rglob("*.py")]:
        for number in re.findall(r"\beqs?\.\s*(\d+\.\d+[a-d]?)", path.read_text(encoding="utf-8")):
            cited.setdefault(number, path.relative_to(ROOT).as_posix())
    for term, definition in GLOSSARY.items():
        for number in re.findall(r"\beqs?\.\s*(\d+\.\d+[a-d]?)", definition):
            cited.setdefault(number, f"GLOSSARY[{term!r}]")
    missing = {n: where for n, where in cited.items() if n not in THEORY_ANCHORS and n not in tags}
    assert cited and not missing, f"cited but not defined in docs/theory.md: {missing}"


class Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        ident = dict(attrs).get("id")
        if tag == "h3" and ident:
            self.ids.append(ident)


def test_the_panel_gives_each_equation_heading_its_id():
    text = glossary.theory_text()
    parser = Ids()
    parser.feed(glossary.theory_markdown(text))
    ids = [i for i in parser.ids if not i.endswith("-range")]
    assert ids == [glossary.anchor_id(n) for n in THEORY_ANCHORS]
    assert glossary.anchor_id("6.10") == "eq-6-10"
    assert "eq-5-1-range" in parser.ids  # "eqs. 5.1–5.4" keeps a heading of its own
    assert "### eq." not in glossary.theory_markdown(text)
    with pytest.raises(ValueError, match="N.M"):
        glossary.anchor_id("2")


def test_a_missing_theory_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="docs/theory.md is missing"):
        glossary.theory_text(tmp_path / "theory.md")


def test_the_script_builds_nodes_and_never_parses_page_text_as_html():
    from ui.lookup import lookup_js

    js = lookup_js()
    for parser in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "DOMParser",
                   "createContextualFragment", "srcdoc"):
        assert parser not in js, f"the look-up script uses {parser}"
    assert 'document.createElement("abbr")' in js and "textContent = words" in js
    for skipped in ("textarea", "input", "[contenteditable]", "code", "pre", ".user-text"):
        assert skipped in js
    terms = json.loads(re.search(r"const TERMS = (\[.*?\]);\s", js, re.DOTALL).group(1))
    assert {term for _, term, _, _ in terms} == set(GLOSSARY)
    assert {form: text for form, _, text, _ in terms if form in GLOSSARY} == GLOSSARY
    assert [len(form) for form, *_ in terms] == sorted((len(form) for form, *_ in terms), reverse=True)
    anchors = json.loads(re.search(r"const ANCHORS = new Set\((\[.*?\])\);", js).group(1))
    assert anchors == list(THEORY_ANCHORS)
    assert "__" not in re.sub(r"window\.__lookup", "", js)  # every placeholder filled
