"""Property-based tests: random text and random numbers through the service layer and every tab's handlers.

Each handler is taken from the built page (ui.page.build_page's events, by api_name), so what runs is exactly the
function a Gradio event calls, wrapped in ui/common.py's user_errors. The properties, on tiny random models:

- nothing raises but UserError (the service) or gr.Error (a handler), and a gr.Error is a clear message,
  never the "Something went wrong" that stands for an unexpected exception;
- a bad value in one number field gives a gr.Error that names that field;
- every figure is under 2 MB of JSON, and every attention row shown (head view, pooled overview, the softmax
  stage of the mask demo) sums to 1.

Text is random Unicode (emoji, CJK, right-to-left, control characters, NUL, special-token strings) up to the
1 MB input cap; numbers are in range, out of range, huge (2**64, 10**400), negative, NaN, ±inf, or strings
("1e999", "abc"). The runs are derandomized, so every run tries the same examples.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"  # a random model name must fail fast, never reach the network

import gradio as gr  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
from gradio.components.plot import PlotData  # noqa: E402
from hypothesis import HealthCheck, Phase, assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama, plotly_array  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.services.attention import MAX_WINDOW, pool_attention, pool_edges  # noqa: E402
from ui.services.checks import REPO_ROOT, UserError, check_float, check_range  # noqa: E402
from ui.services.generation import MAX_GENERATE_TOKENS  # noqa: E402
from ui.services.heads import MAX_HEADS_TOKENS, MAX_IG_STEPS, parse_heads  # noqa: E402
from ui.services.lab import configs as lab  # noqa: E402
from ui.services.masks import MAX_MASK_TOKENS, MAX_STAGE_WINDOW  # noqa: E402
from ui.services.models import ModelStore, known_model_names  # noqa: E402
from ui.services.positions import MAX_PE_DIM, MAX_PE_POSITIONS  # noqa: E402
from ui.services.text import encode  # noqa: E402
from ui.settings import MAX_ATTENTION_TOKENS, LabSettings  # noqa: E402

MAX_FIGURE_BYTES = 2_000_000
MAX_TEXT_BYTES = 1_000_000  # the one cap for typed text and uploads
GENERIC_ERROR = "Something went wrong"  # user_errors' message for an exception nobody turned into a message


def examples(n: int, shrink: bool = True) -> settings:
    """Few, fixed examples: the file stays within about two minutes on 2 cores and never flakes. Texts of up
    to 1 MB are not shrunk: each try costs seconds, and the failing example is reported as it was drawn."""
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else []),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# ---------------------------------------------------------------- strategies

EMOJI = ["😀", "🌍", "👩‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🔥", "\U0001f9e0", "🇯🇵"]
CJK = ["注意力", "機制", "東京", "한국어", "漢字", "ひらがな", "カタカナ"]
RTL = ["العربية", "עברית", "فارسی", "\u202e", "\u202b", "\u200f", "\u2067"]
CONTROL = ["\x00", "\x01", "\x07", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1b", "\x7f", "\x85", "\x9f"]
INVISIBLE = ["\u00a0", "\u200b", "\u200c", "\u200d", "\u2028", "\u2029", "\ufeff", "\ufffd", "\uffff", "e\u0301\u0308"]
MARKUP = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "{{ x }}",
          "{% if %}", "<script>alert(1)</script>", "**", "|", "\\", "'\"", "&amp;", "$x$", "3.2, 5.0", "run1"]
WORDS = ["The", " lighthouse", " keeper", " lit", " the", " lamp", ".", " ", "  ", "\n\n", "a", "-", "0", "9"]

pieces = st.one_of(
    st.text(max_size=30),  # any Unicode scalar value (hypothesis leaves out surrogates unless asked)
    st.sampled_from(EMOJI + CJK + RTL + CONTROL + INVISIBLE + MARKUP + WORDS),
    st.lists(st.sampled_from(EMOJI + CJK + RTL + CONTROL + WORDS), max_size=20).map("".join),
)
texts = st.lists(pieces, max_size=12).map("".join)
lone_surrogates = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)
texts_with_surrogates = st.tuples(texts, lone_surrogates, texts).map("".join)


def repeated_to(chunk: str, size: int) -> str:
    """chunk repeated to `size` UTF-8 bytes, cut at a character boundary."""
    unit = chunk.encode("utf-8")
    data = (unit * (size // len(unit) + 1))[:size]
    return data.decode("utf-8", "ignore")


# sizes spread over the whole range up to the cap, the cap itself included
big_texts = st.builds(
    repeated_to,
    texts.filter(lambda t: len(t.encode()) > 0),
    st.one_of(st.integers(1, MAX_TEXT_BYTES), st.just(MAX_TEXT_BYTES)),
)

HUGE = [2**63, 2**64, -(2**64), 10**400, -(10**400)]
NON_FINITE = [float("nan"), float("inf"), float("-inf"), "1e999", "-1e999", "nan", "inf", "-Infinity"]
NOT_NUMBERS = ["abc", "1,5", "0x1f", "1.5e", "--1", "½", "🔢"]
MISSING = [None, "", " "]

numbers = st.one_of(
    st.integers(-5, 600),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(HUGE + NON_FINITE + NOT_NUMBERS + MISSING),
    st.integers(-5, 600).map(str),
    st.floats(-10, 600).map(repr),
    st.sampled_from(["１２", "٣", " 7 ", "1_000", "+3", "2.0", "1e2"]),  # what Python's int() and float() read
)


def bad_numbers(low: int, high: int, missing_is_bad: bool = True):
    """Values no field with the range [low, high] may accept."""
    extra = MISSING if missing_is_bad else []
    return st.one_of(
        st.sampled_from([v for v in HUGE if not low <= v <= high] + NON_FINITE + NOT_NUMBERS + extra),
        st.integers(high + 1, high + 10**6),
        st.integers(low - 10**6, low - 1),
        st.floats(high + 1, 1e300),
        st.floats(-1e300, low - 1),
    )


# ---------------------------------------------------------------- the page, on tiny models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("property-models")
    return {"llama": str(build_tiny_llama(root / "tiny-llama")), "bert": str(build_tiny_bert(root / "tiny-bert"))}


class Handlers(dict):
    """api_name → the function its event calls; short in hypothesis's report of a failing example."""

    def __repr__(self) -> str:
        return f"Handlers({len(self)} events)"


@pytest.fixture(scope="module")
def page(tiny):
    """The handlers of the built page by api_name, and its services (the page is built, not launched)."""
    from ui.page import build_page

    services = Services.create(models=ModelStore(extra_names=[tiny["llama"], tiny["bert"]]))
    demo = build_page(services, tiny["llama"])
    handlers = Handlers({fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name and fn.fn is not None})
    return handlers, services


models = st.sampled_from(["llama", "bert"])


# ---------------------------------------------------------------- bugs these properties found

BIG = 10**400  # an int that no float can hold: what JSON's integers and Python's int() can carry


def generic_error(fn, *args) -> bool:
    """Whether fn(*args) ends in something other than a clear message (UserError, or gr.Error from user_errors)."""
    try:
        result = fn(*args)
        if hasattr(result, "__next__"):
            list(result)
    except gr.Error as exc:
        return str(exc.message).startswith(GENERIC_ERROR)
    except UserError:
        return False
    except Exception:  # noqa: BLE001 - the bug: an exception nobody turned into a message
        return True
    return False


# bugs these properties found, now fixed: name → (what it was, probe(page, tiny) → True if it came back)
KNOWN_BUGS = {
    "huge_int": (
        "check_range('Layer', 10**400, 0, 1) raises OverflowError (formatting the value as a float) "
        "instead of a UserError",
        lambda page, tiny: generic_error(check_range, "Layer", BIG, 0, 1),
    ),
    "huge_float": (
        "check_float('Temperature', 10**400, 0, 5) raises OverflowError (float(value)) instead of a "
        "UserError",
        lambda page, tiny: generic_error(check_float, "Temperature", BIG, 0.0, 5.0),
    ),
    "surrogate": (
        "encode(model, '\\ud800') raises the tokenizer's TypeError instead of a UserError",
        lambda page, tiny: generic_error(encode, page[1].models.get(tiny["llama"]), "a\ud800b"),
    ),
    "long_name": (
        "ModelStore.get('x' * 300) raises OSError (File name too long, from Path.is_dir) instead of a UserError",
        lambda page, tiny: generic_error(page[0]["load_model"], "x" * 300),
    ),
}


# handlers that once called int() on the raw layer/head inputs after the service had checked them: "0.0" (which
# check_range reads as 0) passed the check and then failed in int("0.0"); they now use index_of
RAW_INT = {  # endpoint → (where, index of the layer argument after the model name)
    "attention": ("ui/views/attention.py attention_view: int(layer_index)", 1),
    "positional_encoding": ("ui/views/positions.py: export.filename(..., int(layer_index), int(head_index))", 4),
    "mask_demo": ("ui/views/masks.py mask_view: int(layer_index), int(head_index)", 1),
    "head_atlas": ("ui/views/heads.py atlas_view: int(layer_index), int(head_index)", 2),
    "attribute": ("ui/views/heads.py attribution_view: int(layer_index), int(head_index)", 2),
}


def raw_int_probe(endpoint: str, index: int):
    def probe(page, tiny) -> bool:
        args = list(VALID[endpoint])
        args[index] = "0.0"
        return generic_error(page[0][endpoint], tiny["llama"], *args)

    return probe


KNOWN_BUGS.update({
    f"int_{endpoint}": (f"{where} fails on layer '0.0', which the service accepts as 0 (ValueError)",
                        raw_int_probe(endpoint, index))
    for endpoint, (where, index) in RAW_INT.items()
})


@pytest.mark.parametrize("bug", sorted(KNOWN_BUGS))
def test_bugs_the_properties_found_stay_fixed(page, tiny, bug):
    assert not KNOWN_BUGS[bug][1](page, tiny), KNOWN_BUGS[bug][0]


def call(fn, *args):
    """A handler's outputs (a generator is run to its end, keeping every update), or the gr.Error it raised.
    Any other exception propagates and fails the property. Every message the page would show (the error, and each
    text output with a space in it: notes, not the path of a file to download) names no absolute server path."""
    try:
        result = fn(*args)
        updates = list(result) if hasattr(result, "__next__") else [result]
    except gr.Error as exc:
        assert_no_server_path(str(exc.message))
        return [], exc
    for update in updates:
        for value in update if isinstance(update, tuple) else (update,):
            if isinstance(value, str) and " " in value:
                assert_no_server_path(value)
    return updates, None


def assert_no_server_path(text: str) -> None:
    """None of the server's own folders (the repository, the weight store, the temporary directory) in a message."""
    from core.store import WeightStore

    for root in (str(REPO_ROOT), str(WeightStore.default().root.resolve()), tempfile.gettempdir() + "/"):
        assert root not in text, f"a server path in a message: {root!r} in {text[:300]!r}"


def assert_clear(error: gr.Error | None, field: str | None = None) -> None:
    if error is None:
        return
    message = str(error.message)
    assert message.strip(), "an empty error message"
    assert not message.startswith(GENERIC_ERROR), f"an unexpected exception reached the page: {message}"
    if field is not None:
        assert field in message, f"the message does not name {field!r}: {message}"


def figures(updates) -> list[tuple[int, dict]]:
    """(bytes of JSON, figure dict) of every figure in the outputs: a plotly Figure, or the PlotData that a
    gr.Plot output also takes (the figure's JSON)."""
    found = []
    for update in updates:
        for value in update if isinstance(update, tuple) else (update,):
            if isinstance(value, go.Figure):
                text = value.to_json()
            elif isinstance(value, PlotData):
                text = value.plot
            else:
                continue
            found.append((len(text.encode()), json.loads(text)))
    return found


def assert_small(updates) -> None:
    for size, fig in figures(updates):
        title = fig.get("layout", {}).get("title", {})
        assert size < MAX_FIGURE_BYTES, f"a figure of {size:,} bytes of JSON ({title})"


def assert_rows_sum_to_one(matrix, what: str) -> None:
    rows = np.asarray(matrix, dtype=np.float64)
    assert np.all(np.isfinite(rows)), f"{what}: not finite"
    np.testing.assert_allclose(rows.sum(-1), 1.0, atol=2e-3, err_msg=what)


def head_view_rows(value, what: str) -> None:
    """A head view (cell by cell, or pooled to blocks): every row sums to 1."""
    ((_, fig),) = figures([value])
    assert_rows_sum_to_one(plotly_array(fig["data"][0]["z"]), what)


# ---------------------------------------------------------------- the service layer


@examples(60)
@given(kind=models, text=texts, max_tokens=st.one_of(st.none(), st.integers(1, 3000)))
def test_encode_gives_tokens_within_the_limit_or_a_user_error(page, tiny, kind, text, max_tokens):
    _, services = page
    model = services.models.get(tiny[kind])
    try:
        enc = encode(model, text, max_tokens)
    except UserError as exc:
        assert str(exc)
        return
    limit = min(max_tokens or model.config.max_positions, model.config.max_positions)
    assert 1 <= len(enc.ids) <= limit
    assert len(enc.labels) == len(enc.special) == len(enc.ids)
    assert len(set(enc.labels)) == len(enc.labels)  # plotly merges equal category names
    assert all(label.strip() for label in enc.labels)


@example(kind="llama", text="\ud800")
@examples(15)
@given(kind=models, text=texts_with_surrogates)
def test_encode_reads_or_refuses_text_with_lone_surrogates(page, tiny, kind, text):
    """JSON can carry "\\ud800" on its own, and Python keeps it in a str; the tokenizer cannot encode it."""
    _, services = page
    try:
        encode(services.models.get(tiny[kind]), text)
    except UserError as exc:
        assert str(exc)


@example(value=BIG, low=0, span=10)
@example(value=-BIG, low=0, span=10)
@example(value=2**64, low=0, span=10)
@example(value=-(2**64), low=0, span=10)
@example(value=-1, low=0, span=10)
@example(value=float("nan"), low=0, span=10)
@example(value=float("inf"), low=0, span=10)
@example(value=float("-inf"), low=0, span=10)
@example(value="1e999", low=0, span=10)
@example(value="abc", low=0, span=10)
@examples(120)
@given(value=numbers, low=st.integers(-10, 10), span=st.integers(0, 2**40))
def test_check_range_gives_a_whole_number_in_range_or_names_the_field(value, low, span):
    high = low + span
    try:
        result = check_range("Fieldname", value, low, high)
    except UserError as exc:
        assert "Fieldname" in str(exc)
        return
    assert isinstance(result, int) and not isinstance(result, bool)
    assert low <= result <= high


@example(value=BIG, low=0.0, span=5.0, low_open=False)
@example(value=-BIG, low=0.0, span=5.0, low_open=False)
@example(value=2**64, low=0.0, span=5.0, low_open=False)
@example(value=-1, low=0.0, span=5.0, low_open=False)
@example(value=float("nan"), low=0.0, span=5.0, low_open=False)
@example(value=float("inf"), low=0.0, span=5.0, low_open=False)
@example(value=float("-inf"), low=0.0, span=5.0, low_open=False)
@example(value="1e999", low=0.0, span=5.0, low_open=False)
@example(value="abc", low=0.0, span=5.0, low_open=False)
@examples(120)
@given(value=numbers, low=st.floats(-10, 10), span=st.floats(0, 1e6), low_open=st.booleans())
def test_check_float_gives_a_finite_number_in_range_or_names_the_field(value, low, span, low_open):
    high = low + span
    try:
        result = check_float("Fieldname", value, low, high, low_open=low_open)
    except UserError as exc:
        assert "Fieldname" in str(exc)
        return
    assert isinstance(result, float) and math.isfinite(result)
    assert (low < result if low_open else low <= result) and result <= high


@examples(60)
@given(
    data=st.one_of(
        texts.map(lambda t: t.encode("utf-8")),
        st.binary(max_size=2000),
        st.tuples(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b""]), texts.map(str.encode)).map(b"".join),
        big_texts.map(str.encode),
        st.integers(MAX_TEXT_BYTES - 2, MAX_TEXT_BYTES + 2).map(lambda n: b"a" * n),
    ),
    suffix=st.sampled_from([".txt", ".md", ".TXT", ".Md", ".pdf", ".py", "", ".txt.exe"]),
)
def test_an_upload_gives_its_text_or_a_clear_error(page, data, suffix):
    """read_upload, through the load_text handler the upload events call."""
    handlers, _ = page
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"upload{suffix}"
        path.write_bytes(data)
        outputs, error = call(handlers["load_text"], str(path))
    assert_clear(error)
    if error is None:
        assert isinstance(outputs[0], str) and outputs[0].strip()
        assert len(data) <= MAX_TEXT_BYTES


@examples(80)
@given(text=st.one_of(texts, st.lists(st.tuples(numbers, numbers), max_size=4).map(
    lambda pairs: ", ".join(f"{a}.{b}" for a, b in pairs))), n_layers=st.integers(1, 40), n_heads=st.integers(1, 40))
def test_parse_heads_gives_existing_heads_or_a_user_error(text, n_layers, n_heads):
    try:
        pairs = parse_heads(text, n_layers, n_heads)
    except UserError as exc:
        assert str(exc)
        return
    assert pairs and len(set(pairs)) == len(pairs)
    assert all(0 <= layer < n_layers and 0 <= head < n_heads for layer, head in pairs)


@examples(60)
@given(n=st.integers(1, 300), blocks=st.integers(1, 300), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_pooled_attention_rows_still_sum_to_one(n, blocks, causal, seed):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((2, n, n)) * rng.uniform(0.1, 30)
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
    edges = pool_edges(n, blocks)
    assert edges[0] == 0 and edges[-1] == n and np.all(np.diff(edges) > 0)
    assert_rows_sum_to_one(pool_attention(probs, edges, edges), f"pooled {n} → {len(edges) - 1}")


@example(name="x" * 300)
@examples(40)
@given(name=st.one_of(texts, st.text(min_size=200, max_size=400), st.sampled_from(
    ["", ".", "..", "/", "weights", "tests", "/etc/passwd", "a/b", "../../..", "\x00", "x" * 256, "é" * 200])))
def test_a_model_name_loads_or_gives_a_clear_error(page, tiny, name):
    """The load_model handler (the picker's change event) on any name the API can send."""
    handlers, _ = page
    assume(name not in known_model_names() and name not in tiny.values())
    outputs, error = call(handlers["load_model"], name)
    assert_clear(error)
    if error is None:
        assert isinstance(outputs[0], str)


# ---------------------------------------------------------------- the tabs' handlers


def attention_args(tiny, kind, text, layer, head, hide, q0, k0, window):
    return (tiny[kind], text, layer, head, hide, q0, k0, window, None)


heads_values = st.one_of(st.sampled_from(["mean of heads", "mean", "0", "1", "3", "4", " 2 ", "-1"]), numbers)


@example(kind="llama", text="The keeper", layer="0.0", head="mean of heads", hide=False, q0=0, k0=0, window=8)
@example(kind="llama", text="The keeper", layer=0, head="mean of heads", hide=False, q0=0, k0=0, window=BIG)
@examples(50)
@given(kind=models, text=texts, layer=numbers, head=heads_values, hide=st.booleans(), q0=numbers, k0=numbers,
       window=numbers)
def test_attention_tab(page, tiny, kind, text, layer, head, hide, q0, k0, window):
    handlers, _ = page
    outputs, error = call(handlers["attention"], *attention_args(tiny, kind, text, layer, head, hide, q0, k0, window))
    assert_clear(error)
    if error is None:
        assert_attention_outputs(outputs[0], hide, page[1].kept)


def assert_attention_outputs(outputs, hide: bool, kept) -> None:
    note, model_fig, head_fig, window_fig, columns_fig, capture = outputs
    assert isinstance(note, str) and note
    assert_small([outputs])
    overview, n_tokens = capture.overview(kept), capture.key[1]  # [L, H, S, S]: means over blocks of queries and keys
    assert overview is not None, "the capture this session keeps is gone right after the call"
    assert np.all(np.isfinite(overview)) and overview.min() >= 0 and overview.max() <= 1 + 1e-2  # float16 kept
    if overview.shape[-1] == n_tokens:  # short texts: one cell per token
        assert_rows_sum_to_one(overview, "the model view's overview [L, H, n, n]")
    if not hide:
        head_view_rows(head_fig, "the head view")


@examples(8, shrink=False)
@given(kind=models, text=big_texts, hide=st.booleans())
def test_attention_tab_on_texts_up_to_the_cap(page, tiny, kind, text, hide):
    handlers, _ = page
    outputs, error = call(handlers["attention"], *attention_args(tiny, kind, text, 0, "mean of heads", hide, 0, 0, 64))
    assert_clear(error)
    if error is None:
        assert_attention_outputs(outputs[0], hide, page[1].kept)


@example(text="Hi", chat=False, max_new=BIG, temperature=0.0, top_k=0, top_p=1.0, seed=0)
@example(text="Hi", chat=False, max_new=2, temperature=BIG, top_k=0, top_p=1.0, seed=0)
@examples(30)
@given(
    text=texts,
    chat=st.booleans(),
    max_new=st.one_of(st.integers(-2, 12), st.sampled_from(HUGE + NON_FINITE + NOT_NUMBERS + MISSING + [512, 513])),
    temperature=st.one_of(st.floats(0, 2), numbers),
    top_k=st.one_of(st.integers(0, 50), numbers),
    top_p=st.one_of(st.floats(0.05, 1.0), numbers),
    seed=st.one_of(st.integers(0, 2**31), numbers),
)
def test_generate_tab(page, tiny, text, chat, max_new, temperature, top_k, top_p, seed):
    handlers, _ = page
    args = (tiny["llama"], text, chat, max_new, temperature, top_k, top_p, seed)
    updates, error = call(handlers["generate"], *args)
    assert_clear(error)
    for update in updates:
        assert all(isinstance(value, str) for value in update)


@examples(6, shrink=False)
@given(text=big_texts, chat=st.booleans())
def test_generate_tab_on_prompts_up_to_the_cap(page, tiny, text, chat):
    handlers, _ = page
    updates, error = call(handlers["generate"], tiny["llama"], text, chat, 2, 0.0, 0, 1.0, 0)
    assert_clear(error)


@example(kind="llama", n=16, d=8, p=0, k=1, layer="0.0", head=0, text="The keeper")
@example(kind="llama", n=BIG, d=8, p=0, k=1, layer=0, head=0, text="The keeper")
@examples(40)
@given(kind=models, n=st.one_of(st.integers(2, 512), numbers), d=st.one_of(st.integers(1, 256).map(lambda x: 2 * x),
       numbers), p=numbers, k=numbers, layer=numbers, head=heads_values, text=texts)
def test_positional_encoding_tab(page, tiny, kind, n, d, p, k, layer, head, text):
    handlers, _ = page
    outputs, error = call(handlers["positional_encoding"], tiny[kind], n, d, p, k, layer, head, text)
    assert_clear(error)
    assert_small(outputs)


@example(kind="llama", text="The keeper", layer="0.0", head=0, start=0, size=4, text_a="a b c", text_b="a")
@example(kind="llama", text="The keeper", layer=BIG, head=0, start=0, size=4, text_a="a b c", text_b="a")
@examples(40)
@given(kind=models, text=texts, layer=numbers, head=heads_values, start=numbers, size=numbers, text_a=texts,
       text_b=texts)
def test_mask_tab(page, tiny, kind, text, layer, head, start, size, text_a, text_b):
    handlers, _ = page
    outputs, error = call(handlers["mask_demo"], tiny[kind], text, layer, head, start, size, text_a, text_b)
    assert_clear(error)
    if error is None:
        assert_mask_outputs(outputs[0])


def assert_mask_outputs(outputs) -> None:
    assert_small([outputs])
    stages = [fig for _, fig in figures(outputs[1:7])]  # causal mask on: scores, + mask, softmax; then off
    if "⚠️" in outputs[0] and not any(fig["data"] for fig in stages):   # a refusal: a note, the figures empty
        refusals = ("not drawn", "needs at least 2 tokens", "The text is empty")  # the last: only whitespace
        assert any(words in outputs[0] for words in refusals), outputs[0]
        return
    softmax = [fig["data"][0] for fig in stages[2::3]]
    assert len(stages) == 6 and len(softmax) == 2
    for trace in softmax:
        assert_rows_sum_to_one(plotly_array(trace["z"]), "a softmax stage of the mask demo")


@examples(5, shrink=False)
@given(kind=models, text=big_texts, text_a=st.one_of(texts, big_texts), text_b=st.one_of(texts, big_texts))
def test_mask_tab_on_texts_up_to_the_cap(page, tiny, kind, text, text_a, text_b):
    handlers, _ = page
    outputs, error = call(handlers["mask_demo"], tiny[kind], text, 0, 0, 0, 12, text_a, text_b)
    assert_clear(error)
    if error is None:
        assert_mask_outputs(outputs[0])


scores = st.one_of(st.sampled_from(["previous_token", "first_token", "local", "entropy", "duplicate_token",
                                    "induction"]), texts)
ablations = st.one_of(st.sampled_from(["zero", "mean"]), texts)


@example(kind="llama", text="The keeper", score="previous_token", layer="0.0", head=0)
@example(kind="llama", text="The keeper", score="previous_token", layer=BIG, head=0)
@examples(30)
@given(kind=models, text=texts, score=scores, layer=numbers, head=numbers)
def test_heads_tab_atlas(page, tiny, kind, text, score, layer, head):
    handlers, _ = page
    outputs, error = call(handlers["head_atlas"], tiny[kind], text, score, layer, head, None)
    assert_clear(error)
    if error is None:
        assert_small(outputs)
        head_view_rows(outputs[0][4], "the Heads tab's head view")


@examples(30)
@given(kind=models, text=texts, heads_text=st.one_of(texts, st.sampled_from(["0.0", "1.3, 0.2", "0.0 0.0", "9.9"])),
       kind_name=ablations)
def test_heads_tab_ablation(page, tiny, kind, text, heads_text, kind_name):
    handlers, _ = page
    outputs, error = call(handlers["ablate_heads"], tiny[kind], text, heads_text, kind_name)
    assert_clear(error)
    assert_small(outputs)


@examples(15)
@given(kind=models, text=texts, kind_name=ablations, score=scores)
def test_heads_tab_sweep(page, tiny, kind, text, kind_name, score):
    handlers, _ = page
    updates, error = call(handlers["ablation_sweep"], tiny[kind], text, kind_name, score, None)
    assert_clear(error)
    assert_small(updates)


@example(kind="llama", text="The keeper lit the lamp.", position=-1, layer="0.0", head=0, steps=2)
@example(kind="llama", text="The keeper lit the lamp.", position=-1, layer=BIG, head=0, steps=2)
@examples(30)
@given(kind=models, text=texts, position=numbers, layer=numbers, head=numbers,
       steps=st.one_of(st.integers(1, 8), numbers))
def test_heads_tab_attribution(page, tiny, kind, text, position, layer, head, steps):
    handlers, _ = page
    outputs, error = call(handlers["attribute"], tiny[kind], text, position, layer, head, steps, None)
    assert_clear(error)
    assert_small(outputs)


@example(kind="llama", target="a\ud800b", foil="", baseline="pad")
@example(kind="llama", target="", foil="<|im_end|>", baseline="zero")
@examples(20)
@given(kind=models, target=st.one_of(texts, texts_with_surrogates, numbers), foil=st.one_of(texts, numbers),
       baseline=st.one_of(st.sampled_from(["pad", "mean", "zero"]), texts))
def test_heads_tab_attribution_target_foil_and_baseline(page, tiny, kind, target, foil, baseline):
    """Whatever is typed as a target or foil token, or sent as a baseline: a result, or a message naming the box."""
    handlers, _ = page
    outputs, error = call(handlers["attribute"], tiny[kind], "The keeper lit the lamp.", -1, 0, 0, 2, target, foil,
                          baseline, None)
    assert_clear(error)
    if error is not None:
        assert any(name in str(error.message) for name in ("Target token", "Foil token", "Baseline", "foil must")), \
            error.message
    assert_small(outputs)


@examples(20)
@given(kind=models, text=texts, endpoint=st.sampled_from(["logit_lens", "surprisal"]))
def test_heads_tab_lens_and_surprisal(page, tiny, kind, text, endpoint):
    handlers, _ = page
    outputs, error = call(handlers[endpoint], tiny[kind], text, None)
    assert_clear(error)
    assert_small(outputs)


@examples(5, shrink=False)
@given(kind=models, text=big_texts, endpoint=st.sampled_from(["head_atlas", "surprisal", "logit_lens"]))
def test_heads_tab_on_texts_up_to_the_cap(page, tiny, kind, text, endpoint):
    handlers, _ = page
    args = (tiny[kind], text, "previous_token", 0, 0, None) if endpoint == "head_atlas" else (tiny[kind], text, None)
    outputs, error = call(handlers[endpoint], *args)
    assert_clear(error)
    assert_small(outputs)


@example(task="copy", family="llama", n_layers=BIG, d_model=32, n_heads=1, d_ff=32, dropout=0.0, positions="default",
         norm="default", seed=0, steps=10, lr=1e-3, snapshot_steps="")
@example(task="copy", family="llama", n_layers=1, d_model=32, n_heads=1, d_ff=32, dropout=BIG, positions="default",
         norm="default", seed=0, steps=10, lr=1e-3, snapshot_steps="")
@examples(80)
@given(
    task=st.one_of(st.sampled_from(["copy", "reverse", "sort", "add", "dates"]), texts),
    family=st.one_of(st.sampled_from(["marian", "llama"]), texts),
    n_layers=st.one_of(st.integers(1, 4), numbers),
    d_model=st.one_of(st.sampled_from([32, 64, 128, 256]), numbers),
    n_heads=st.one_of(st.integers(1, 8), numbers),
    d_ff=st.one_of(st.integers(1, 1024), numbers),
    dropout=st.one_of(st.floats(0, 0.5), numbers),
    positions=st.one_of(st.sampled_from(list(lab.POSITIONS)), texts),
    norm=st.one_of(st.sampled_from(list(lab.NORMS)), texts),
    seed=st.one_of(st.integers(0, 2**31 - 1), numbers),
    steps=st.one_of(st.integers(1, 3000), numbers),
    lr=st.one_of(st.floats(1e-5, 0.1), numbers),
    snapshot_steps=st.one_of(texts, st.lists(numbers, max_size=10).map(lambda v: ", ".join(map(str, v)))),
)
def test_lab_settings_give_a_checked_config_or_a_user_error(
    task, family, n_layers, d_model, n_heads, d_ff, dropout, positions, norm, seed, steps, lr, snapshot_steps
):
    """The Lab tab's train and compare events read every field through lab.make_config before training."""
    try:
        config = lab.make_config(LabSettings(), task, family, n_layers, d_model, n_heads, d_ff, dropout, positions,
                                 norm, True, True, seed, steps, lr, snapshot_steps)
    except UserError as exc:
        assert str(exc)
        return
    assert 1 <= config.n_layers <= 4 and 32 <= config.d_model <= 256 and config.d_model % config.n_heads == 0
    assert 1 <= config.steps <= LabSettings().max_steps and 1e-5 <= config.lr <= 0.1


@examples(20)
@given(run_id=st.one_of(texts, numbers), source=st.one_of(texts, numbers))
def test_lab_attention_of_an_unknown_run_is_a_clear_error(page, run_id, source):
    handlers, _ = page
    outputs, error = call(handlers["lab_attention"], run_id, source, None)
    assert error is not None  # this session has trained nothing
    assert_clear(error)


# ---------------------------------------------------------------- one bad number: the message names its field

# endpoint → (valid arguments, {field: (argument index, low, high)}); tiny llama: 2 layers, 4 heads, 2,048 positions
VALID = {
    "attention": ("The keeper lit the lamp.", 0, "mean of heads", False, 0, 0, 8, None),
    "positional_encoding": (16, 8, 0, 1, 0, 0, "The keeper lit the lamp."),
    "mask_demo": ("The keeper lit the lamp.", 0, 0, 0, 4, "a longer text than the other", "short"),
    "generate": ("Hi", False, 2, 0.0, 0, 1.0, 0),
    "head_atlas": ("The keeper lit the lamp.", "previous_token", 0, 0, None),
    "attribute": ("The keeper lit the lamp.", -1, 0, 0, 2, None),
}
FIELDS = [
    ("attention", "Layer", 1, 0, 1),
    ("attention", "Head", 2, 0, 3),
    # where a range depends on the text's length, `high` is the longest text's: every value above it is bad
    ("attention", "Window query start", 4, 0, MAX_ATTENTION_TOKENS - 1),
    ("attention", "Window key start", 5, 0, MAX_ATTENTION_TOKENS - 1),
    ("attention", "Window size", 6, 2, MAX_WINDOW),
    ("positional_encoding", "Positions n", 0, 2, MAX_PE_POSITIONS),
    ("positional_encoding", "Dimensions d", 1, 2, MAX_PE_DIM),
    ("positional_encoding", "Start position p", 2, 0, 14),
    ("positional_encoding", "Offset k", 3, 1, 15),
    ("positional_encoding", "Layer", 4, 0, 1),
    ("positional_encoding", "Head", 5, 0, 3),
    ("mask_demo", "Layer", 1, 0, 1),
    ("mask_demo", "Head", 2, 0, 3),
    ("mask_demo", "Window start", 3, 0, MAX_MASK_TOKENS - 1),
    ("mask_demo", "Window size", 4, 2, MAX_STAGE_WINDOW),
    ("generate", "Max new tokens", 2, 1, MAX_GENERATE_TOKENS),
    ("generate", "Temperature", 3, 0, 5),
    ("generate", "Top-k", 4, 0, 10**6),
    ("generate", "Top-p", 5, 0, 1),
    ("generate", "Seed", 6, 0, 2**63 - 1),
    ("head_atlas", "Layer", 2, 0, 1),
    ("head_atlas", "Head", 3, 0, 3),
    ("attribute", "Position", 1, -1, MAX_HEADS_TOKENS - 1),
    ("attribute", "Layer", 2, 0, 1),
    ("attribute", "Head", 3, 0, 3),
    ("attribute", "Steps", 4, 1, MAX_IG_STEPS),
]
OPTIONAL = {("generate", "Top-k"), ("generate", "Top-p"), ("generate", "Seed")}  # empty: off / unseeded
# a bad field is a note under the figures it changes; the others are drawn (a whole endpoint, or one field of one)
NOTED = {"positional_encoding", ("mask_demo", "Window start"), ("mask_demo", "Window size")}




@pytest.mark.parametrize("endpoint, field, index, low, high", FIELDS, ids=[f"{e}-{f}" for e, f, *_ in FIELDS])
def test_a_bad_number_is_named_in_the_error(page, tiny, endpoint, field, index, low, high):
    handlers, _ = page
    noted = endpoint in NOTED or (endpoint, field) in NOTED
    # a noted field's endpoint draws every figure for each value (about 0.5 s a try): fewer drawn values there,
    # the same six explicit ones

    @examples(6 if noted else 12)
    @given(bad=bad_numbers(low, high, missing_is_bad=(endpoint, field) not in OPTIONAL))
    @example(bad=BIG)
    @example(bad=2**64)
    @example(bad=float("nan"))
    @example(bad=float("inf"))
    @example(bad="1e999")
    @example(bad="abc")
    def check(bad):
        args = list(VALID[endpoint])
        args[index] = bad
        outputs, error = call(handlers[endpoint], tiny["llama"], *args)
        if noted:
            notes = [value for value in outputs[-1] if isinstance(value, str)]
            assert error is None and any(field in note for note in notes), f"{field} = {bad!r}: no note says so"
            return
        assert error is not None, f"{field} = {bad!r} was accepted"
        assert_clear(error, field)

    check()
