"""Every lesson's "Try it" through the page's own events, as Gradio runs them: the button's click (open_tab, fed the
lesson's link) and then each event chained after it (the target tab's run or first screen, gated on its fields),
each called with its inputs as Gradio fills them (gr.Progress put in by gradio's own special_args; a stream run to
its end). The target tab opens on the lesson's text and settings and computes there: no error, every figure it
draws has data, Generate has written a continuation and the Lab has drawn its saved run's attention. Every lesson
on the tiny Llama and on the tiny BERT, every field and setting its link names (on SmolLM2, every lesson's Try it is
clicked in the browser: tests/browser/test_browser_learn.py)."""

from __future__ import annotations

import inspect
import json
import os
from types import SimpleNamespace

import pytest


os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

import gradio as gr  # noqa: E402
from gradio.components.plot import PlotData  # noqa: E402
from gradio.helpers import special_args  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama  # noqa: E402
from ui.services.lab import saved as shipped  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402
from ui.views.learn import course as views  # noqa: E402


def built_page(names: list[str], default: str):
    from ui.page import build_page
    from ui.services import Services
    from ui.services.models import ModelStore
    from ui.settings import AppSettings

    services = Services.create(AppSettings.from_env(), ModelStore(extra_names=names))
    return build_page(services, default), services


def try_chain(demo) -> list:
    """The try button's click and every event chained after it, in order."""
    button = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "learn-try")
    fns = list(demo.fns.values())
    chain = [next(fn for fn in fns if any(target[0] == button._id and target[1] == "click"
                                          for target in fn.targets))]
    while True:
        after = [fn for fn in fns if fn.trigger_after == chain[-1]._id and fn.fn is not None]   # not the page's
        if not after:   # count of landings, a script in the browser
            return chain
        chain.append(after[0])


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def plotted(value):
    """A figure among an event's outputs as JSON (a plotly figure, the PlotData `present` sends, or a gr.Plot
    update holding either), else None."""
    if isinstance(value, dict) and "value" in value:
        value = value["value"]
    if isinstance(value, gr.Plot):
        value = value.value
    if isinstance(value, PlotData):
        return json.loads(value.plot)
    if hasattr(value, "to_plotly_json"):
        return json.loads(value.to_json())
    return None


def by_id(demo, elem_id: str):
    return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == elem_id)


# the fields a lesson's link sets, by (tab, the link's key): their elem_ids
FIELD_IDS = {("attention", "text"): "attn-text", ("generate", "text"): "gen-text", ("heads", "text"): "heads-text",
             ("inside", "text"): "inside-text", ("masks", "text"): "mask-text", ("positions", "text"): "pe-text",
             ("heads", "score"): "heads-score", ("generate", "max_new_tokens"): "gen-max-new",
             ("generate", "chat"): "gen-chat", ("lab", "lab_run"): "lab-pick", ("lab", "source"): "lab-source",
             ("patching", "site"): "patch-site", ("masks", "approx_text"): "approx-text",
             ("masks", "approx_method"): "approx-method", ("masks", "k"): "approx-k"}


def run_try(demo, chain, link: dict) -> tuple[str, list, dict, dict]:
    """Run the chain as the page does on a fresh page; returns (the tab it opened, the figures the target's event
    drew, as JSON, every component's value afterwards, by id, and each figure drawn by its elem_id)."""
    values = {block_id: getattr(block, "value", None) for block_id, block in demo.blocks.items()}
    drawn, target, named = [], None, {}
    for index, fn in enumerate(chain):
        inputs = [link] if index == 0 else [values[block._id] for block in fn.inputs]
        inputs, *_ = special_args(fn.fn, list(inputs), None, None)
        result = fn.fn(*inputs)
        if inspect.isgenerator(result):   # a stream: what it shows when it ends
            *_, result = result
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if index == 0:
            target = result[1]
        ran = not all(is_skip(v) for v in result)
        for block, value in zip(fn.outputs, result):
            if not is_skip(value):
                values[block._id] = value.get("value", value) if isinstance(value, dict) else value
        if index and ran:
            drawn += [figure for figure in map(plotted, result) if figure is not None]
            named.update({block.elem_id: plotted(value) for block, value in zip(fn.outputs, result)
                          if plotted(value) is not None})
    return target, drawn, values, named


def check_every_try(names: list[str], default: str) -> None:
    demo, services = built_page(names, default)
    chain = try_chain(demo)
    for lesson in syllabus.lessons():
        page = views.lesson_page(services, default, lesson.name)
        link = views.try_state(page.link)
        target, drawn, values, named = run_try(demo, chain, link)
        assert target == link["tab"], lesson.name
        for key, value in link.items():   # the fields and settings the lesson names are set in its tab
            if (target, key) in FIELD_IDS:
                assert values[by_id(demo, FIELD_IDS[target, key])._id] == value, (lesson.name, key)
        assert (link.get("compute") is False or link["tab"] not in ("heads", "generate", "lab")
                or set(link) - {"tab", "compute"}), lesson.name   # a landing that computes names its input
        measured = views.measured(services, default, syllabus.find(lesson.name))   # the page's own, cached
        if link.get("compute") is False:   # a model the tab cannot run: the lesson's note says why, nothing runs
            assert measured.note and not drawn, lesson.name
            continue
        notes = [v for v in values.values() if isinstance(v, str) and v.startswith(("Error", "Something went"))]
        assert not notes, (lesson.name, notes)
        if target == "generate":   # written on from the lesson's text, greedily, and its tokens in the strip
            written = values[by_id(demo, "gen-output")._id]
            assert isinstance(written, str) and written.strip(), (lesson.name, "nothing generated")
            strip = values[by_id(demo, "gen-strip")._id]   # the gr.Radio update the strip's step returns (as a dict,
            # as one event's steps send it)
            assert (strip.get("choices") if isinstance(strip, dict) else strip.choices), (lesson.name, "no strip")
            continue
        assert drawn, (lesson.name, target, "the target tab computed nothing")
        # the figure that holds the lesson's subject, named by its link, is computed: it has data, or (only where
        # the lesson's note says this model lacks it) a note in place of its data
        if set(measured.link) - {"tab"}:
            assert link.get("show"), (lesson.name, "the link names no figure of its subject")
            assert link["show"] in named, (lesson.name, link["show"], "not computed", sorted(named))
            assert named[link["show"]]["data"] or measured.note, (lesson.name, link["show"], "no data")
        if target == "lab":   # the saved run's attention: its answer in the note, every map drawn with data
            assert link["lab_run"] in values[by_id(demo, "lab-attn-note")._id], lesson.name
            maps = 3 if link["lab_run"] == shipped.REVERSE else 1   # encoder, decoder and cross, or a decoder's
            assert len(drawn) == maps and all(figure["data"] for figure in drawn), lesson.name
        # a figure with data; only where the lesson itself says this model cannot run it (its note) may the
        # target say so too (the tiny tokenizer splits the patching prompts unevenly)
        assert any(figure["data"] for figure in drawn) or measured.note, (lesson.name, target, "no data")
        for figure in drawn:   # each has data, or is a note saying why this model has nothing there
            notes = [a.get("text") for a in figure.get("layout", {}).get("annotations", []) if a.get("text")]
            assert figure["data"] or notes, (lesson.name, target, figure.get("layout", {}).get("title"))


@pytest.mark.parametrize("default", ["llama", "bert"])
def test_every_try_it_lands_computed_on_tiny_models(tmp_path_factory, default):
    """On a decoder, and on an encoder (where a tab that cannot run opens on why, and the others compute what an
    encoder has: the browser's Learn walk clicks every Try it on SmolLM2 only)."""
    folder = tmp_path_factory.mktemp("learn-try")
    names = {"llama": str(build_tiny_llama(folder / "llama")), "bert": str(build_tiny_bert(folder / "bert"))}
    check_every_try(list(names.values()), names[default])


def test_the_heads_link_opens_on_the_induction_probe(tmp_path):
    """The Heads lesson's head was found on the seeded probe (random tokens, then the same again): its link opens
    that head on the probe's text, which repeats, so an induction head has something to copy there."""
    from core import load_model
    from core.analysis import heads
    from ui.services.heads import INDUCTION_LENGTH, INDUCTION_SEED
    from ui.services.learn import attention

    model = load_model(str(build_tiny_llama(tmp_path / "llama")), device="cpu")
    link = attention.measure_heads(model).link
    text = link["text"]
    half = len(text) // 2
    assert text[:half] == text[half:] and half > 0
    special = tuple(model.tokenizer.all_special_ids)
    probe = heads.induction_probe(model.config.vocab_size, INDUCTION_LENGTH, INDUCTION_SEED, avoid=special)
    assert text == model.tokenizer.decode(probe[0].tolist(), skip_special_tokens=True)
    state = views.try_state(link)
    assert {"layer", "head"} <= set(state)
    assert state["score"] == "induction"   # the map the tab opens on is the score the lesson chose the head by


def test_the_try_notes_say_what_lands_there(tmp_path):
    """Where the tab computes something beside the lesson's figure (a continuation, a saved run's attention), the
    note under Try it says what lands and names the run and its source; elsewhere there is no note."""
    from core import load_model

    model = load_model(str(build_tiny_llama(tmp_path / "llama")), device="cpu")
    services = SimpleNamespace(models=SimpleNamespace(get=lambda name, progress=None: model, key=lambda name: name),
                               lessons=syllabus.LessonCache())
    for lesson in syllabus.lessons():
        page = views.lesson_page(services, "tiny", lesson.name)
        if page.link["tab"] in views.TRY_NOTES:
            assert "**" in page.try_note and "{" not in page.try_note, lesson.name
            for value in page.link.get("settings", {}).values():
                assert page.link["tab"] != "lab" or str(value) in page.try_note, (lesson.name, value)
        else:
            assert page.try_note == "", lesson.name
    assert views.try_note({"tab": "generate", "compute": False}) == ""
    assert {"generate", "lab"} <= {views.lesson_page(services, "tiny", name).link["tab"] for name in syllabus.names()}


def test_the_page_holds_no_second_tab_button_and_no_empty_table(tmp_path):
    """A component made inside gr.Tabs but beside its tabs (a State, say) counts as one of its children: the tabs
    after it then register at a second place when first shown, and the page shows a second button for them (it
    did, for the Lab, with the Learn tab's States there). And Generate's KV table, empty until Measure (where it
    shows only its column numbers), opens with Measure."""
    demo, _ = built_page([str(build_tiny_llama(tmp_path / "llama"))], str(tmp_path / "llama"))
    tabs = [block for block in demo.blocks.values() if isinstance(block, gr.Tabs)]
    assert tabs
    for block in tabs:
        strays = [type(child).__name__ for child in block.children if not isinstance(child, gr.Tab)]
        assert not strays, strays
    table = by_id(demo, "gen-kv-table")
    assert table.visible is False
    measure = by_id(demo, "gen-kv-run")
    opens = next(fn for fn in demo.fns.values() if any(t == (measure._id, "click") for t in fn.targets))
    assert table in opens.outputs and all(update["visible"] for update in opens.fn())


def test_generates_stop_ends_a_stream_that_try_it_started(tmp_path):
    demo, _ = built_page([str(build_tiny_llama(tmp_path / "llama"))], str(tmp_path / "llama"))
    chain = try_chain(demo)
    stream = next(i for i, fn in enumerate(chain) if by_id(demo, "gen-output") in fn.outputs and
                  by_id(demo, "gen-stats") in fn.outputs)
    stop = by_id(demo, "gen-stop")
    cancels = [dependency.get("cancels") or [] for dependency in demo.get_config_file()["dependencies"]
               if any(target[0] == stop._id for target in dependency["targets"])]
    assert any(chain[stream]._id in ids for ids in cancels)
