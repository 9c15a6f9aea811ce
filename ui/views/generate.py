"""The Generate tab's views: the stats line as the model writes, one step's figures, the trace's JSON download,
and the KV panel's table and figure; the bodies of `generation_step`, `export_generation` and `kv_cache`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.generation import kv_timing_figure, step_overview_figure, step_rows_figure, top_probs_figure
from ui.plots.text import escaped, shaded_text_html
from ui.services import Services
from ui.services.attention import pool_edges
from ui.services.generation import GenerationTrace, GenerationUpdate, cap_note
from ui.services.kept import KeptStore
from ui.services.generation.kv_cache import kv_headers, kv_report
from ui.services.text import token_texts
from ui.services.generation.trace import OVERVIEW_KEYS, StepView, check_trace, pooled_overview, step_view, trace_summary
from ui.views import export

MAX_EXPORT_BYTES = export.MAX_EXPORT_BYTES  # the JSON download stays below this
SHOWN_EVERY_S = 0.25  # after the first tokens, the page is sent the text at most this often
SHOWN_FIRST = 16  # tokens sent one by one, so the first words show at once


def paced(updates, every_s: float = SHOWN_EVERY_S, first: int = SHOWN_FIRST):
    """The stream's updates as the page is sent them: the first `first` each, then at most one per `every_s`
    seconds, and always the last. Each update the page receives costs the browser a pass over the whole page;
    at one per token a busy machine's browser fell behind and answered a click on Stop only after tens of
    seconds."""
    held, last, stream = None, 0.0, iter(updates)
    try:
        for count, update in enumerate(stream, start=1):
            now = time.monotonic()
            if count <= first or now - last >= every_s:
                held, last = None, now
                yield update
            else:
                held = update
    finally:  # closing this closes the stream, so Stop still ends the model's loop
        getattr(stream, "close", lambda: None)()
    if held is not None:
        yield held


def stats_line(update: GenerationUpdate) -> str:
    state = f"done ({update.stop_reason})" if update.done else "writing…"
    line = f"**{update.n_new}** tokens in {update.seconds:.2f} s, **{update.tokens_per_second:.1f} tokens/s**; {state}"
    return line + (f"  \n⚠️ {update.note}" if update.note else "")


def mark_stopped(stats: str) -> str:
    return stats.replace("writing…", "stopped") if "writing…" in stats else stats


def step_outputs(view: StepView):
    """Note, probabilities, attention row, overview, shaded text and raw numbers of one step."""
    title = f"step {view.step}: {view.token!r}"
    note = f"**Step {view.step}**, token {escaped(repr(view.token))}. {escaped(view.sentence)}"
    probs = top_probs_figure(view.top_tokens, view.top_probs, view.chosen_in_top,
                                              f"Top {len(view.top_tokens)} next tokens at {title}")
    if view.rows is None:
        message = view.note or "No attention rows for this step."
        empty = empty_figure(message)
        return note + "  \n" + message, probs, empty, empty, "", view.numbers()
    cross = view.cross_rows
    row = step_rows_figure(
        view.keys, view.head_row, view.mean_row, view.head, f"Layer {view.layer}: the row that wrote {title}",
        view.source_keys if cross is not None else None,
        None if cross is None else cross[view.layer, view.head], None if cross is None else cross[view.layer].mean(0))
    weights, keys = pooled_overview(view.rows, view.keys)
    cross_weights, source_keys = (None, None) if cross is None else pooled_overview(cross, view.source_keys)
    overview = step_overview_figure(
        weights, keys, view.rows.shape[1], f"Every layer × head's row for {title}", cross_weights, source_keys)
    caption = (f"Shaded by layer {view.layer}'s mean over heads for {title} (the outlined token); grey: written "
               "after it.")
    position = len(view.keys)  # the picked token follows its context
    shaded = shaded_text_html(
        view.pieces, view.mean_row, position, caption, view.source_pieces if cross is not None else None,
        None if cross is None else cross[view.layer].mean(0))
    return note, probs, row, overview, shaded, view.numbers()
def export_trace(model, trace: GenerationTrace | None, kept: KeptStore, folder: str | Path | None = None
                 ) -> tuple[Path, str]:
    """The trace as a JSON file (tokens, probabilities, attention rows) under MAX_EXPORT_BYTES, and a note
    saying what was pooled to fit. Rows go per head when they fit, else the mean over heads, else that mean
    with keys pooled into blocks, else none."""
    trace = check_trace(trace)
    data = trace_summary(model, trace, kept)
    rows, cross_rows, rows_kept = trace.rows(kept), trace.cross_rows(kept), trace.rows_kept(kept)
    data["context_tokens"] = token_texts(model, trace.prompt_ids)
    if trace.seq2seq:
        data["source_tokens"] = token_texts(model, trace.source_ids)
    levels = (("per head", "nothing"), ("mean over heads", "each layer's heads averaged"),
              ("mean over heads, keys pooled", f"heads averaged and keys pooled into at most {OVERVIEW_KEYS} blocks"),
              ("none", "attention rows left out: even pooled they exceed the limit"))
    for layout, pooled in levels:
        data["attention"] = {"layout": layout, "pooled": pooled, "kept_for_steps": rows_kept,
                             "dims": attention_dims(layout, trace.seq2seq),
                             "self": [export_rows(r, layout) for r in rows]}
        if trace.seq2seq:
            data["attention"]["cross"] = [export_rows(r, layout) for r in cross_rows]
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) < MAX_EXPORT_BYTES:
            break
    name = export.filename(trace.model_name, f"generation-trace-{time.strftime('%Y%m%d-%H%M%S')}") + ".json"
    path = export.write(text, name, root=Path(folder) if folder else None)  # removed with the other exports
    size = path.stat().st_size
    note = (f"**{path.name}**: {len(trace.tokens)} tokens, {size / 1e6:.2f} MB; attention rows {layout}"
            + ("" if pooled == "nothing" else f" (pooled: {pooled})") + ".")
    if rows_kept < len(trace.tokens):
        note += " " + cap_note(trace, kept)
    return path, note


def attention_dims(layout: str, seq2seq: bool) -> str:
    keys = "keys: the context (prompt, or start token, and earlier tokens)" + ("; cross: the source" if seq2seq else "")
    return {"per head": f"[layer][head][key]; {keys}", "mean over heads": f"[layer][key]; {keys}",
            "mean over heads, keys pooled": f"[layer][block of keys]; {keys}", "none": ""}[layout]


def export_rows(rows: np.ndarray | None, layout: str):
    if rows is None or layout == "none":
        return None
    rows = rows.astype(np.float32)
    if layout != "per head":
        rows = rows.mean(1)  # [L, Tk]
        if layout.endswith("pooled") and rows.shape[-1] > OVERVIEW_KEYS:
            edges = pool_edges(rows.shape[-1], OVERVIEW_KEYS)
            rows = np.add.reduceat(rows, edges[:-1], axis=-1)
    return np.round(rows, 5).tolist()


def step_figures(services: Services, step_value, layer_value, head_value, session_trace):
    """One step of the session's trace: note, probabilities, attention row, overview, shaded text, numbers."""
    recorded = check_trace(session_trace)
    model = services.models.get(recorded.model_name)
    return step_outputs(step_view(model, recorded, step_value, layer_value, head_value, services.kept))


def trace_file(services: Services, session_trace):
    """The session's trace as a JSON file: (path, note)."""
    recorded = check_trace(session_trace)
    path, note = export_trace(services.models.get(recorded.model_name), recorded, services.kept)
    return str(path), note


def kv_panel(services: Services, model_name, prompt_text, progress=None):
    """The KV panel: its note, the size table, the timing figure, and the same numbers in bytes and seconds."""
    model = services.models.get(model_name, progress)
    report = kv_report(model, prompt_text)
    t = report.timing
    figure = kv_timing_figure(
        t.lengths, t.uncached_at, t.cached_at, t.step_lengths, t.uncached_steps, t.cached_steps,
        f"One new token: without the cache ∝ n^{t.uncached_exponent:.2f}, with it ∝ n^{t.cached_exponent:.2f}")
    table = {"headers": kv_headers(model), "data": report.sizes.rows}
    return report.note, table, figure, report.numbers()
