"""What every tab shares: turning errors into messages in the page, a text box with an upload, progress,
one head's map over a whole text."""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path

import gradio as gr
import numpy as np

from core.store import WeightsError
from ui import plots, service
from ui.service import UserError, index_of  # noqa: F401 - the tabs take index_of from here

log = logging.getLogger(__name__)

ANALYSIS = "analysis"  # concurrency group of the forward-pass events: one at a time on a small CPU
ANALYSIS_LIMIT = 1
EXAMPLES = Path(__file__).resolve().parent.parent / "assets" / "examples"


def _as_gradio_error(exc: Exception) -> gr.Error:
    if isinstance(exc, gr.Error):
        return exc
    if isinstance(exc, UserError):
        return gr.Error(service.public_text(str(exc)), print_exception=False)
    if isinstance(exc, WeightsError):
        return gr.Error(service.public_text(f"Model weights: {exc}"), print_exception=False)
    if isinstance(exc, MemoryError):
        return gr.Error("Out of memory: try a shorter text or a smaller window.", print_exception=False)
    log.exception("unexpected error in an app event")
    return gr.Error(
        f"Something went wrong ({type(exc).__name__}); the server log has the details.", print_exception=False
    )


def user_errors(fn):
    """Run an event function so that bad input becomes a clear message in the page, never a traceback."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every error becomes a message
                raise _as_gradio_error(exc) from None

        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error becomes a message
            raise _as_gradio_error(exc) from None

    return wrapper


def progress_callback(progress: gr.Progress):
    """core.store reports (fraction, message); Gradio's bar takes the same two things."""

    def report(fraction: float, message: str) -> None:
        progress(min(max(float(fraction), 0.0), 1.0), desc=message)

    return report


@user_errors
def load_upload(path: str | None) -> str:
    """The uploaded file's text, for the text box next to it."""
    return service.read_upload(path)


def text_with_upload(
    label: str, value: str, prefix: str, lines: int = 6, api_name: str | None = None, max_lines: int = 14
):
    """A text box (elem_id prefix-text) with a .txt/.md upload (prefix-upload) that fills it.
    Returns (textbox, file)."""
    text = gr.Textbox(label=label, value=value, lines=lines, max_lines=max_lines, elem_id=f"{prefix}-text")
    upload = gr.File(
        label=f"…or upload a .txt / .md file (at most {service.MAX_TEXT_BYTES / 1e6:g} MB, UTF-8)",
        file_types=list(service.UPLOAD_SUFFIXES),
        type="filepath",
        height=130,
        elem_id=f"{prefix}-upload",
        elem_classes=["upload"],
    )
    upload.upload(
        load_upload,
        inputs=upload,
        outputs=text,
        api_name=api_name,
        api_visibility="public" if api_name else "private",
        concurrency_limit=4,
    )
    return text, upload


def read_example(name: str) -> str:
    """One of the example texts in assets/examples/, shown in the text boxes when the page opens."""
    return (EXAMPLES / name).read_text(encoding="utf-8").strip()


def parse_head(value, n_heads: int, allow_mean: bool = True) -> int | None:
    """'mean of heads' → None (when allowed), else an index in range, or a UserError."""
    if value in ("mean", "mean of heads") and allow_mean:
        return None
    return service.check_range("Head", value, 0, n_heads - 1)


def kept_index(value, size: int) -> int:
    """A layer or head index kept across a change of model when the new model has it, else 0."""
    index = index_of(value)
    return index if index is not None and 0 <= index < size else 0


def checked_inputs(demo: gr.Blocks) -> gr.Blocks:
    """Every input of the page, answered in words and logged in one line.

    Number fields pass their raw value to the handler, which checks it with service.check_range or
    check_float and names the field: Gradio's own rounding and bounds fail first otherwise, on "1e999", NaN
    or a string from the API, with an error that names nothing. Any other component that refuses a value (a
    dropdown value not among its choices) says so with the field's label, without a traceback in the log."""
    for block in demo.blocks.values():
        if isinstance(block, (gr.Number, gr.Slider)):
            block.preprocess = _unchanged
        elif isinstance(block, gr.Textbox):
            block.preprocess = _capped(block, block.preprocess)
        elif isinstance(block, gr.components.Component):
            block.preprocess = _refusing_in_words(block, block.preprocess)
    return demo


def _unchanged(payload):
    return payload


def _label(block) -> str:
    return getattr(block, "label", None) or getattr(block, "elem_id", None) or type(block).__name__


def _capped(block, preprocess):
    """Typed text is held to the same cap as uploads (service.MAX_TEXT_BYTES)."""

    @functools.wraps(preprocess)
    def checked(payload):
        try:
            return service.check_text_size(_label(block), preprocess(payload))
        except UserError as exc:
            log.info("refused a text for %s: over the cap", _label(block))
            raise gr.Error(str(exc), print_exception=False) from None

    return checked


def _refusing_in_words(block, preprocess):
    label = _label(block)

    @functools.wraps(preprocess)
    def checked(payload):
        try:
            return preprocess(payload)
        except Exception as exc:  # noqa: BLE001 - a refused value is the user's error, not the server's
            message = service.public_text(str(exc).strip('"') or type(exc).__name__)
            if len(message) > 300:
                message = message[:300] + "…"
            log.info("refused a value for %s: %s", label, message[:200])
            raise gr.Error(f"{label}: {message}", print_exception=False) from None

    return checked


def head_figure(tokens: service.Encoded, matrix: np.ndarray, title: str, hide_special: bool = False):
    """One head's map [n, n] over the whole text: cell by cell with token labels up to FULL_VIEW_TOKENS, else
    pooled to HEAD_OVERVIEW_SIZE blocks per side (rows still sum to 1)."""
    n = len(tokens.ids)
    if n <= service.FULL_VIEW_TOKENS:
        pos = service.visible_positions(tokens, 0, n, hide_special)
        if pos.size == 0:
            raise UserError("Every token is a special token; untick 'hide special tokens' to see them.")
        labels = [tokens.labels[p] for p in pos]
        return plots.attention_heatmap(matrix[np.ix_(pos, pos)], labels, labels, title)
    edges = service.pool_edges(n, service.HEAD_OVERVIEW_SIZE)
    pooled = service.pool_attention(matrix, edges, edges)
    return plots.pooled_heatmap(
        pooled, edges, edges, f"{title}: {n:,} tokens pooled to {len(edges) - 1}×{len(edges) - 1}"
    )
