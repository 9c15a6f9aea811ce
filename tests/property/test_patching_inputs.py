"""Property-based tests of the Patching tab's endpoints (patch_sweep, logit_attribution, flow_graph) on inputs that
make the service or the core refuse: equal prompts, prompts over the limit (one or both), different token
counts, answer and foil tokens that are not one token or are the same, and empty prompts.

Each handler is taken from the built page by api_name, so what runs is the function a Gradio event calls. Every
answer is a message in words: a note (the figure empty, no file) or a gr.Error that is not the "Something went
wrong" of an exception nobody put in words, and never a traceback. A prompt over the limit is refused naming the
limit and each prompt's token count, never cut.
"""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

import gradio as gr  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tiny_app_model import build_tiny_llama  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.services.models import ModelStore  # noqa: E402
from ui.services.patching import MAX_FLOW_TOKENS, MAX_PATCH_TOKENS  # noqa: E402

GENERIC_ERROR = "Something went wrong"
WORDS = ["the", " bread", " is", " warm", " and", " lamp", " shop", " Mary", " John", " gave", " a", " drink", " to",
         ",", ".", " 注意", " 😀", " <b>x</b>", "\n"]


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The Patching handlers of the built page, and the tiny model's name and tokenizer."""
    from ui.page import build_page

    llama = str(build_tiny_llama(tmp_path_factory.mktemp("patching-inputs") / "tiny-llama"))
    services = Services.create(models=ModelStore(extra_names=[llama]))
    demo = build_page(services, llama)
    handlers = {fn.api_name: fn.fn for fn in demo.fns.values()
                if fn.api_name in ("patch_sweep", "logit_attribution", "flow_graph")}
    assert len(handlers) == 3
    return handlers, llama, services.models.get(llama).tokenizer


def answer_of(fn, *args):
    """(outputs of the last update, None) or (None, the gr.Error raised); anything else fails the test."""
    try:
        result = fn(*args)
        updates = list(result) if hasattr(result, "__next__") else [result]
    except gr.Error as error:
        return None, error
    return updates[-1], None


def assert_in_words(outputs, error) -> str:
    """The message the page shows, checked to be words: not empty, not the generic error, no traceback."""
    text = str(error.message) if error is not None else outputs[0]
    assert isinstance(text, str) and text.strip(), "no message"
    assert not text.startswith(GENERIC_ERROR), f"an exception reached the page unworded: {text}"
    assert "Traceback" not in text and 'File "' not in text, text
    return text


def refused(outputs, error) -> str:
    """A refusal: a worded note with no data file (or a worded gr.Error)."""
    text = assert_in_words(outputs, error)
    if error is None:
        assert outputs[2] is None, f"a result was given where a refusal was expected: {text[:200]}"
    return text


def count(tokenizer, text: str) -> int:
    return len(tokenizer(text).input_ids)


phrases = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map("".join).filter(lambda t: t.strip())
long_phrases = st.lists(st.sampled_from(WORDS[:14]), min_size=80, max_size=160).map("".join)
tokens_typed = st.one_of(st.just(""), st.sampled_from([" Mary", " lighthouse keeper", "  ", "😀😀", "<b>", " the"]),
                         st.text(max_size=8))
sites = st.sampled_from(["resid_pre", "attn_out", "mlp_out", "z", "z_by_position"])
modes = st.sampled_from(["denoise", "noise"])


@examples(12)
@given(text=phrases, answer=tokens_typed, foil=tokens_typed, site=sites, mode=modes)
def test_equal_prompts_are_refused_in_words(page, text, answer, foil, site, mode):
    handlers, llama, _ = page
    outputs, error = answer_of(handlers["patch_sweep"], llama, text, text, answer, foil, site, mode, 0)
    refused(outputs, error)
    # attribution reads only the clean run: equal prompts are fine there, or refused in words (a bad token)
    outputs, error = answer_of(handlers["logit_attribution"], llama, text, text, answer, foil)
    assert_in_words(outputs, error)


@examples(8)
@given(long=long_phrases, short=phrases, long_is_clean=st.booleans(), site=sites, mode=modes)
def test_prompts_over_the_limit_are_refused_naming_the_limit_and_both_counts(page, long, short, long_is_clean, site,
                                                                           mode):
    handlers, llama, tokenizer = page
    clean, corrupted = (long, short) if long_is_clean else (short, long)
    counts = f"the clean prompt has {count(tokenizer, clean):,} tokens and the corrupted one {count(tokenizer, corrupted):,}"
    for name, args in (("patch_sweep", (site, mode, 0)), ("logit_attribution", ())):
        text = refused(*answer_of(handlers[name], llama, clean, corrupted, "", "", *args))
        assert f"at most {MAX_PATCH_TOKENS} tokens" in text and counts in text, text
    text = refused(*answer_of(handlers["flow_graph"], llama, long, 0.04))
    assert f"at most {MAX_FLOW_TOKENS} tokens, and the clean prompt has {count(tokenizer, long):,} tokens" in text


@examples(12)
@given(clean=phrases, corrupted=phrases, answer=tokens_typed, foil=tokens_typed, site=sites, mode=modes,
       layer=st.sampled_from([0, 1]))
def test_any_short_pair_is_measured_or_refused_in_words(page, clean, corrupted, answer, foil, site, mode, layer):
    """Different token counts, multi-token answers, answer == foil, equal metrics from the core: each is a
    worded note; a pair that passes every check is measured (a data file)."""
    handlers, llama, tokenizer = page
    outputs, error = answer_of(handlers["patch_sweep"], llama, clean, corrupted, answer, foil, site, mode, layer)
    text = assert_in_words(outputs, error)
    if count(tokenizer, clean) != count(tokenizer, corrupted):
        assert outputs[2] is None and "same number of tokens" in text, text
    outputs, error = answer_of(handlers["logit_attribution"], llama, clean, corrupted, answer, foil)
    assert_in_words(outputs, error)
    outputs, error = answer_of(handlers["logit_attribution"], llama, clean, "", answer, foil)
    assert_in_words(outputs, error)


@examples(6)
@given(text=st.one_of(phrases, st.sampled_from(["", "   ", "\n"])), threshold=st.sampled_from([0.0, 0.04, 0.5, 1.0]))
def test_the_flow_graph_answers_any_short_prompt_in_words(page, text, threshold):
    handlers, llama, _ = page
    outputs, error = answer_of(handlers["flow_graph"], llama, text, threshold, None)
    message = assert_in_words(outputs, error)
    if not text.strip():
        assert outputs[2] is None and "empty" in message
