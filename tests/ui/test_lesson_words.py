"""Lessons speak to a student: no implementation detail (kernel counters, allocator settings, a family's layout
name, an unbuilt method's name) in what a lesson says, the words it reads from shipped measurements included, and
the terms a lesson or tab uses without saying them (K-composition, the relative score, Sink^ε) in the glossary."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ui.glossary import GLOSSARY
from ui.services import inside
from ui.services.generation import generation_reason
from ui.services.learn import generation
from ui.services.learn.course import lessons

ROOT = Path(__file__).resolve().parents[2]
LESSON_MODULES = sorted((ROOT / "ui" / "services" / "learn").glob("*.py")) + \
    sorted((ROOT / "ui" / "views" / "learn").glob("*.py"))
# implementation terms: the kernel's counters, the C allocator and its settings, a family's layout name, a method
# step named only in a paper
# (as written in prose: 'marian', the family's name in code, is no page text)
IMPLEMENTATION = re.compile(r"VmHWM|\bRSS\b|mmap|glibc|malloc|\bKiB\b|Marian|GradDrop|kernel's high-water")


def page_strings(path: Path) -> list[str]:
    """Every string a module may put on the page: its string constants and f-strings' text, not its docstrings or
    comments."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_lesson_names_an_implementation_detail():
    for lesson in lessons():
        said = " ".join([lesson.title, lesson.text, lesson.question.prompt, *lesson.question.choices,
                         lesson.text_sample])
        assert not IMPLEMENTATION.search(said), f"{lesson.name}: {IMPLEMENTATION.search(said).group()!r}"


@pytest.mark.parametrize("path", LESSON_MODULES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_no_lesson_module_writes_an_implementation_term(path):
    found = [s for s in page_strings(path) if IMPLEMENTATION.search(s)]
    assert not found, f"{path.name} puts implementation terms on the page: {found}"


def test_the_cost_lessons_measured_words_are_plain():
    """The words the cost lesson reads from the shipped measurements: the measurement's own method line names the
    kernel's counter and the allocator's threshold, which stay on the Inside tab beside its command."""
    words, _ = generation.softmax_memory(64)
    words += " " + generation.layer_cost_words()
    assert not IMPLEMENTATION.search(words), IMPLEMENTATION.search(words).group()
    memory = inside.online_softmax_memory()
    if memory is not None:
        assert inside.LESSON_METHOD in words
        assert "VmHWM" in inside.measured_sentence(memory, command=True)   # the Inside tab keeps the exact method


def test_the_generate_note_says_what_an_encoder_is_in_plain_words():
    model = SimpleNamespace(config=SimpleNamespace(causal=False, is_encoder_decoder=False, family="bert"))
    note = generation_reason(model)
    assert note.startswith("This model (bert) is an encoder: it reads the whole text in both directions")
    assert "here is an encoder" not in note


@pytest.mark.parametrize("term", ["K-composition", "relative score", "Sink^ε", "peak memory"])
def test_the_terms_used_without_saying_them_are_in_the_glossary(term):
    assert term in GLOSSARY and len(GLOSSARY[term]) > 40
