"""The words match the numbers: a lesson's own text types no measured number (only the theory's: equation numbers,
the textbook's example d_k = 64, 4d²; and the constants its measurement reads, checked against that measurement),
the line under each figure states the answer Reveal gives, and the sentences that describe a figure say what that
figure draws. On a tiny decoder and encoder, and on the real SmolLM2 and MiniLM for the lessons that are cheap
there."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from tiny import OneModel
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from ui.services import learn
from ui.services.learn import block, generation
from ui.services.learn import course as syllabus
from ui.views.learn import course as views
from ui.views.learn import figure

# what a lesson's text may say in digits: the theory, not a measurement
THEORY = [r"eqs?\. \d+\.\d+(–\d+\.\d+)?", r"d_k = 64, scores of size 8", r"mean 0", r"variance 1\b", r"it is 1\.",
          r"back to 1 whatever", r"exactly 0\b", r"t [−+] 1", r"0…t", r"\d*d²", r"SmolLM2", r"GPT-2", r"2 · L"]
NUMBER = re.compile(r"\d[\d,]*(\.\d+)?")


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """Every lesson measured once on each tiny model, by kind."""
    folder = tmp_path_factory.mktemp("numbers")
    return {"llama": measured_all(load_model(str(build_tiny_llama(folder / "llama")), device="cpu")),
            "bert": measured_all(load_model(str(build_tiny_bert(folder / "bert")), device="cpu"))}


def measured_all(model, names=None) -> dict:
    services = SimpleNamespace(models=OneModel(model), lessons=syllabus.LessonCache())
    return {name: views.measured(services, "m", syllabus.find(name)) for name in names or syllabus.names()}


def typed(text: str) -> list[str]:
    """The numbers a text types once the theory's are taken out."""
    for pattern in THEORY:
        text = re.sub(pattern, "", text)
    return [m.group(0) for m in NUMBER.finditer(text)]


def formats(value: float) -> set[str]:
    """The ways the course writes a measured number."""
    return {learn.number(value), f"{value:.1f}", f"{value:.2f}", f"{value:.3g}", f"{value:,.0f}", f"{value:.2g}"}


def test_no_lesson_types_a_measured_number_in_its_text(tiny_results):
    """The lesson's text and question: only the theory's numbers, and the constants the measurement reads, which
    must be the ones it read (the question's layer, the question's length)."""
    results = tiny_results["llama"]
    for lesson in syllabus.lessons():
        numbers = typed(lesson.text + "\n" + lesson.question.prompt)
        if lesson.name == "block":
            assert numbers == [str(results["block"].values["asked_layer"])], numbers
        elif lesson.name == "kv-cache":
            assert numbers == [f"{results['kv-cache'].values['asked']:,}"], numbers
        elif lesson.name == "sinks":   # the question's threshold, the one the map was read with
            assert numbers == [f"{results['sinks'].values['epsilon']:g}"], numbers
        else:
            assert numbers == [], (lesson.name, numbers)
    # a typed result would be caught: the sentence the block lesson used to carry
    assert typed("Pre-LN stayed at 0 % exact match in 600 steps where Post-LN reached 99 %") == ["0", "600", "99"]


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_each_figures_line_states_the_answer_reveal_gives(tiny_results, kind):
    for name, result in tiny_results[kind].items():
        lesson = syllabus.find(name)
        if not lesson.question.numeric or isinstance(result.answer, str):
            continue
        written = {m.group(0) for m in NUMBER.finditer(result.alt)}
        assert formats(float(result.answer)) & written, (name, result.answer, result.alt)


def check_words_against_figures(results: dict) -> None:
    """The sentences that describe a lesson's figure against what the figure draws."""
    scores = results["queries-keys-values"]
    drawn = np.asarray(figure("queries-keys-values", scores).data[0].z, dtype=np.float64)
    blank = int(np.isnan(drawn).sum())
    if blank:   # a causal head: the upper triangle is blank, and no note says otherwise
        assert blank == drawn.shape[0] * (drawn.shape[0] - 1) // 2 and scores.note == ""
    else:       # a head that reads both ways: the note says every cell is filled, with the figure's count
        assert f"all {drawn.size} cells of the figure are filled" in scores.note
    heads = results["heads"]   # the line's total is the answer's: biases and norms included where there are any
    total = f"{int(heads.answer):,}"
    assert (f"{total} parameters" if heads.values["counts"]["biases and norms"] else f"= {total} weights") in heads.alt


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_the_words_describe_the_figure_drawn_on_tiny_models(tiny_results, kind):
    results = tiny_results[kind]
    check_words_against_figures(results)
    init = results["block"].values["init"]     # the block lesson's reason, from the two fresh Lab models it built
    assert f"{init['with']:.1f} %" in results["block"].answer_text
    assert f"{init['without']:.1f} %" in results["block"].answer_text
    assert "99 %" not in block.BLOCK_TEXT and "docs/" not in block.BLOCK_TEXT
    kv = results["kv-cache"]
    if not isinstance(kv.answer, str):
        assert f"{kv.values['asked']:,} tokens" in kv.answer_text
        assert math.isclose(kv.answer, kv.values["allocated"][kv.values["lengths"].index(kv.values["asked"])] / 1e6)
    assert generation.KV_QUESTION_TOKENS >= max(generation.KV_LENGTHS)


def test_the_words_describe_the_figure_drawn_on_smollm2(smollm):
    check_words_against_figures(measured_all(smollm, ["queries-keys-values", "heads"]))


def test_the_words_describe_the_figure_drawn_on_minilm():
    from core.store import WeightsUnavailable, ensure

    try:
        folder = ensure("minilm-l6")
    except WeightsUnavailable as error:
        pytest.skip(f"minilm-l6 is not installed here: {error}")
    results = measured_all(load_model(folder, device="cpu"), ["queries-keys-values", "heads"])
    check_words_against_figures(results)
    assert "no causal mask" in results["queries-keys-values"].note   # the encoder's full map, said under it


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_no_lesson_points_to_a_file(tiny_results, kind):
    """A student reads the page, not the repository: no README, no path, in any words a lesson shows."""
    path = re.compile(r"README|\b(assets|docs|ui|core|bench)/|\b\w+\.(py|md|json)\b")
    for name, result in tiny_results[kind].items():
        lesson = syllabus.find(name)
        shown = [lesson.text, lesson.question.prompt, result.answer_text, result.why, result.alt, result.note,
                 views.try_note(result.link)]
        assert not [words for words in shown if path.search(words)], name


def test_the_first_and_the_cost_lessons_quote_the_saved_measurements_they_name(tiny_results):
    """Lesson 1's Reveal states the Lab's saved GRU-beside-attention result, the cost lesson's the attention layer
    timed alone at long lengths: the same sentences their sources build from the shipped numbers, not retyped."""
    from ui.services.lab import recurrence
    from ui.services.learn import cost as layer_cost

    saved, cost = recurrence.saved(), layer_cost.attention_cost()
    assert saved is not None and cost is not None, "the shipped results are missing (docs/lab.md, bench/)"
    for kind in ("llama", "bert"):
        results = tiny_results[kind]
        assert recurrence.finding(saved) in results["why-attention"].why
        assert results["why-attention"].values["recurrence"]["GRU"]["sequential_steps"] == saved.longest_tokens
        assert layer_cost.cost_sentence(cost, command=False) in results["cost"].why
        assert typed(recurrence.LESSON_TEXT) == []      # the lesson's text names the experiment, not its numbers


def test_the_first_lesson_says_what_its_revealed_figure_draws():
    """The first lesson's text promised the GRU's accuracy by distance in 'the answer' while the revealed figure is
    the timing chart: the text now says the answer's words quote the run and where its curves are drawn, and the
    revealed figure is the timing it names (two bars a run, no distance axis)."""
    from ui.services.lab import recurrence
    from ui.services.learn import Measured
    from ui.views.learn import figure

    assert "The answer shows" not in recurrence.LESSON_TEXT
    assert "figure is the timing" in recurrence.LESSON_TEXT and "Lab's first screen draws" in recurrence.LESSON_TEXT
    values = {"tokens": 16, "at_once": [0.01, 0.011], "one_by_one": [0.05, 0.06], "ratio": 5.0,
              "encoder_only": False}
    fig = figure("why-attention", Measured(5.0, "", "", "", values=values))
    assert [list(trace.x) for trace in fig.data] == [["one pass", "one token at a time"]] * 2
    assert "distance" not in fig.to_json()
