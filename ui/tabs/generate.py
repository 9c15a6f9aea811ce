"""Generate tab: the model writes, token by token, with the KV-cached decoder of the core; then each generated
token can be opened (its attention, its probabilities), and the KV cache is measured."""

from __future__ import annotations

import functools
import inspect

import gradio as gr

from ui.services.generation import (MAX_GENERATE_TOKENS, MAX_TEMPERATURE, MAX_TRACE_BYTES, TOP_PROBS, find_trace,
                                    generation_reason, kept_trace, run_trace, stream_trace)
from ui.services.text import token_texts
from ui.services.generation.trace import trace_summary
from ui.tabs.events import GENERATE, GENERATE_LIMIT, ON_ANALYSIS, handler, progress_callback, user_errors
from ui.tabs.widgets import Tab, checked_pick, click_bridge, layer_head, read_example, run_checked, text_with_upload
from ui.views.generate import kv_panel, mark_stopped, paced, stats_line, step_figures, trace_file

TRACE_TTL_S = 1800  # a session's trace is dropped after half an hour
# a click on a row of the step's all-heads overview (labelled "L3 H2") reads "layer.head"
ROW_READ = 'const m = /^L(\\d+) H(\\d+)$/.exec(String(point.y)); return m ? `${m[1]}.${m[2]}` : null;'
ON_GENERATE = dict(concurrency_id=GENERATE, concurrency_limit=GENERATE_LIMIT)

STEP_INTRO = f"""### Step by step
Every token the model writes is recorded as it streams: the model's top {TOP_PROBS} next-token
probabilities at that step (with the picked one marked, so sampling is visible) and the attention of the query
that produced it, for every layer and head, over everything before it (prompt included; an encoder-decoder also
its cross-attention over the source). Pick a token in the strip. The rows are kept in float16, at most
{MAX_TRACE_BYTES // 2**20} MB per session; tokens past that keep their probabilities only."""

KV_INTRO = """### The KV cache: its bytes counted, its steps timed
Each layer keeps the keys and values of every token it has read, so a new token computes one query, key and value
and reads the rest: size = 2 · layers · tokens · kv_heads · d_head · bytes. *Measure* sizes it for this prompt
(the formula beside the bytes the core allocates) and for the full context, in float32 and bfloat16, against the
same model with one KV head per query head (no GQA) and with one KV head (MQA); then it writes the same greedy
continuation with and without the cache and times one step of each at growing lengths."""

LEAD = """**The decoder at work, token by token**: each new token's query attends through eq. 2.1's causal mask to
the keys and values of everything before it, kept in the KV cache (2 · layers · tokens · kv-heads · d_head numbers)."""


def build(services, picker, initial) -> Tab:
    model = picker.model
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    gr.Markdown(
        "The model extends the prompt one token at a time. Greedy (temperature 0) always picks the most likely "
        "token; higher temperatures, top-k and top-p sample. A seed makes sampling repeat exactly."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt, _ = text_with_upload("Prompt", read_example("generate.txt"), "gen",
                                         services.settings.text_cap_bytes, lines=4)
            chat = gr.Checkbox(
                value=bool(getattr(initial.tokenizer, "chat_template", None)),
                label="Chat mode (wrap the prompt in the model's chat template)",
                elem_id="gen-chat",
            )
        with gr.Column(scale=2):
            max_new = gr.Slider(1, MAX_GENERATE_TOKENS, value=64, step=1, label="Max new tokens", elem_id="gen-max-new")
            temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            with gr.Row():
                top_k = gr.Number(value=0, label="Top-k (0 = off)", precision=0)
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p (1 = off)")
                seed = gr.Number(value=0, label="Seed", precision=0)
            with gr.Row():
                reason = generation_reason(initial)
                run = gr.Button("Generate", variant="primary", elem_id="gen-run", interactive=reason is None)
                stop = gr.Button("Stop", variant="stop", elem_id="gen-stop")
            cannot = gr.Markdown(reason or "", elem_id="gen-cannot")
    output = gr.Textbox(label="Continuation", lines=8, interactive=False, elem_id="gen-output")
    stats = gr.Markdown(label="stats", elem_id="gen-stats")
    send = gr.Button("Send prompt + continuation to the Attention tab", elem_id="gen-send")
    sent = gr.State("")
    trace = gr.State(None, time_to_live=TRACE_TTL_S)  # a TraceRef: the trace itself is in the KeptStore

    gr.Markdown(STEP_INTRO)
    strip = gr.Radio([], label="Generated tokens (pick one)", elem_id="gen-strip", elem_classes=["token-strip"])
    with gr.Row():
        step = gr.Number(value=0, label="Step (0 = first generated token)", precision=0, elem_id="gen-step")
        fields = layer_head(services.models, picker, initial, "gen", row=False)
        show = gr.Button("Show this step", elem_id="gen-show-step")
    fields.note.render()
    step_note = gr.Markdown(label="step note", elem_id="gen-step-note")
    with gr.Row():
        probs_fig = gr.Plot(label="Next-token probabilities", elem_id="gen-step-probs", visible=False)
        row_fig = gr.Plot(label="Attention row", elem_id="gen-step-row", visible=False)
    shaded = gr.HTML(label="shaded text", elem_id="gen-step-text")
    overview_fig = gr.Plot(label="Every layer × head for this token (click a row to show that head above)",
                           elem_id="gen-step-overview", visible=False)
    picked = click_bridge("gen-overview-bridge", ["gen-step-overview"], ROW_READ)
    with gr.Accordion("This step's numbers, the whole trace, the download", open=False):
        step_numbers = gr.JSON(label="Attention rows of this step (chosen layer)", elem_id="gen-step-numbers")
        trace_json = gr.JSON(label="Trace: top-10 probabilities and rank per token", elem_id="gen-trace-json")
        with gr.Row():
            export = gr.Button("Export the trace as JSON", elem_id="gen-export")
            export_file = gr.File(label="Trace (JSON)", elem_id="gen-export-file", interactive=False)
        export_note = gr.Markdown(label="export note", elem_id="gen-export-note")

    kv_run, kv_event, (kv_note, kv_table, kv_fig, kv_numbers) = kv_section(services, model, prompt)

    settings = [model, prompt, chat, max_new, temperature, top_k, top_p, seed]
    step_outputs = [step_note, probs_fig, row_fig, overview_fig, shaded, step_numbers]
    # a new generation starts with no step view and no strip: both described the previous run
    run.click(lambda: ("", *[gr.Plot(value=None, visible=False)] * 3, "", None, gr.Radio(choices=[], value=None)),
              None, [*step_outputs, strip], api_visibility="private", queue=False)
    common = dict(inputs=[*settings, trace], **ON_GENERATE)
    stream = dict(fn=streamed(services), outputs=[output, stats, sent, trace], **common)
    trace_event = dict(fn=finished(services), outputs=[output, trace_json, trace], **common)
    event = run.click(**stream, api_name="generate")
    # after a finished stream this reuses the session's trace; called alone it generates (without streaming)
    done = event.success(**trace_event, api_name="generation_trace")
    fill = wire_stop_and_strip(services, event, done, stop, stats, trace, strip)
    step_event = wire_steps(services, model, step, fields, trace, show, strip, picked, step_outputs)
    export.click(handler(reading_trace(trace_file), services, "export_generation", progress=False), trace,
                 [export_file, export_note], api_name="export_generation")
    @user_errors
    def for_model(name):
        """Chat mode as the model's tokenizer has it; Generate off, saying why, for a model that cannot generate."""
        loaded = services.models.get(name)
        why = generation_reason(loaded)
        return (gr.Checkbox(value=bool(getattr(loaded.tokenizer, "chat_template", None))),
                gr.Button(interactive=why is None), why or "")

    picker.after.add(for_model, [model], [chat, run, cannot])
    # a lesson's "Try it" sets the prompt and the settings it names, then streams, traces and fills the strip
    return Tab(send=send, sent=sent, follows=True,
               settings={"text": prompt, "chat": chat, "max_new_tokens": max_new, "temperature": temperature},
               run_event={**stream, "api_visibility": "private"},
               run_after=[{**trace_event, "api_visibility": "private"}, fill], stop=stop,
               results=[output, stats, sent, trace, strip, *step_outputs, trace_json, export_file, export_note, kv_note,
                        kv_table, kv_fig, kv_numbers],
               press={stats: run, step_note: show, kv_note: kv_run},
               # what a lesson's link may name beyond the continuation: the first new token's step, the cache measured
               parts={"gen-step-row": ({**step_event, "api_visibility": "private"}, step_outputs[1:4]),
                      "gen-kv-fig": ({**kv_event, "api_visibility": "private"}, [kv_table, kv_fig])},
               cannot=lambda name: generation_reason(services.models.get(name)) or "")


def kv_section(services, model, prompt):
    """The KV cache's section: its button, the event that measures it (the `kv_cache` endpoint) and its outputs
    (note, table, figure, numbers)."""
    gr.Markdown(KV_INTRO)
    kv_run = gr.Button("Measure the KV cache on this prompt", elem_id="gen-kv-run")
    kv_note = gr.Markdown(label="KV note", elem_id="gen-kv-note")
    kv_table = gr.Dataframe(label="KV cache size", elem_id="gen-kv-table", interactive=False, visible=False, wrap=True)
    kv_fig = gr.Plot(label="Time per new token", elem_id="gen-kv-fig", visible=False)
    kv_numbers = gr.JSON(label="The same in bytes and seconds", elem_id="gen-kv-numbers", visible=False)
    outputs = [kv_note, kv_table, kv_fig, kv_numbers]
    kv_event = dict(fn=handler(kv_panel, services, "kv_cache"), inputs=[model, prompt], outputs=outputs,
                    **ON_ANALYSIS)
    kv_run.click(show_kv, None, [kv_table, kv_fig], api_visibility="private", queue=False).then(
        **kv_event, api_name="kv_cache")
    return kv_run, kv_event, outputs


def show_kv():
    """The KV table and figure, opened by Measure (an empty table would show only its column numbers)."""
    return gr.update(visible=True), gr.update(visible=True)


def wire_stop_and_strip(services, stream, done, stop, stats, trace, strip) -> dict:
    """Stop cancels the stream; the strip of generated tokens fills once, when the stream is `done` or after Stop
    (from the Stop handler: a cancelled stream's own chain never runs). Not on every token: that re-rendered the
    strip per token and, with the page's other updates, kept a busy browser from answering a click on Stop.
    Returns the strip's fill event (a lesson's "Try it" runs it after its own stream)."""
    fill = dict(fn=strip_of(services), inputs=trace, outputs=strip, api_visibility="private", queue=False)
    done.success(**fill)
    # cancel first, then relabel: an update still in flight from the stream must not overwrite "stopped"
    stop.click(None, None, None, cancels=[stream], api_visibility="private").then(
        mark_stopped, stats, stats, api_visibility="private", queue=False).then(**fill)
    return fill


def wire_steps(services, model, step, fields, trace, show, strip, picked, step_outputs) -> dict:
    """The step view: shown for the step picked on the strip or typed, the layer and head typed or clicked on
    the all-heads overview; its figures (step_outputs[1:4]) hidden until then. A wrong layer or head is a note
    under them, and the step view keeps what it shows. Returns the step view's event."""
    layer, head, models = fields.layer, fields.head, services.models
    step_event = dict(fn=handler(reading_trace(step_figures), services, "generation_step", progress=False),
                      inputs=[step, layer, head, trace], outputs=step_outputs, concurrency_limit=4)
    figures = step_outputs[1:4]
    run_checked(show.click, models, model, fields, step_event, reveal=figures, api_name="generation_step")
    run_checked(strip.input(chosen_step, strip, step, api_visibility="private", queue=False).then, models, model,
                fields, step_event, reveal=figures, api_visibility="private")
    for box in (layer, head):
        run_checked(box.submit, models, model, fields, step_event, reveal=figures, api_visibility="private")

    @user_errors
    def open_row(name, value):
        return checked_pick(services.models.get(name), value)

    picked.click(open_row, [model, picked], [layer, head], api_visibility="private", queue=False).then(
        **step_event, api_visibility="private")
    return step_event


def streamed(services):
    """The `generate` endpoint: the continuation as it is written, with the session's trace growing."""

    @user_errors
    def generate(model_name, prompt_text, chat_mode, max_new_tokens, temperature_value, top_k_value, top_p_value,
                 seed_value, session_trace=None, progress=gr.Progress()):
        model_obj = services.models.get(model_name, progress_callback(progress))
        previous = find_trace(services.kept, session_trace)
        ticket = getattr(session_trace, "ticket", None)
        # each token computed in turn with the other generations (services.turns)
        stream = stream_trace(model_obj, model_name, prompt_text, chat_mode, max_new_tokens, temperature_value,
                              top_k_value, top_p_value, seed_value, services.kept, previous=previous,
                              turns=services.turns, ticket=ticket)
        for update, recorded in paced(stream):  # the page is sent the text at most four times a second
            yield update.new_text, stats_line(update), update.prompt_text + update.new_text, recorded.ref()

    return generate


def finished(services):
    """The `generation_trace` endpoint: the session's finished trace for these settings, with its summary."""

    @user_errors
    def generation_trace(model_name, prompt_text, chat_mode, max_new_tokens, temperature_value, top_k_value,
                         top_p_value, seed_value, session_trace):
        model_obj = services.models.get(model_name)
        # a trace the server's budget dropped is generated again (the same settings and seed: the same tokens)
        done = run_trace(model_obj, model_name, find_trace(services.kept, session_trace), prompt_text, chat_mode,
                         max_new_tokens, temperature_value, top_k_value, top_p_value, seed_value, services.kept,
                         services.turns, getattr(session_trace, "ticket", None))
        return done.new_text, trace_summary(model_obj, done, services.kept), done.ref()

    return generation_trace


def strip_of(services):
    """The strip of generated tokens, from the session's trace."""

    @user_errors
    def show_strip(recorded):
        if recorded is None or not recorded.tokens:  # the TraceRef carries the ids: no trip to the KeptStore
            return gr.Radio(choices=[], value=None)
        labels = token_texts(services.models.get(recorded.model_name), list(recorded.tokens))
        return gr.Radio(choices=[(label, str(i)) for i, label in enumerate(labels)])

    return show_strip


def reading_trace(view):
    """view(services, ..., session_trace) given the trace that the session's TraceRef names; one the server's
    budget dropped is a message that says so."""

    @functools.wraps(view)
    def read(services, *args, **kwargs):
        bound = inspect.signature(view).bind(services, *args, **kwargs)
        bound.arguments["session_trace"] = kept_trace(services.kept, bound.arguments.get("session_trace"))
        return view(*bound.args, **bound.kwargs)

    return read


def chosen_step(value: str | None) -> int:
    """The strip's value (the step as text) as the step number."""
    return int(value) if value not in (None, "") else 0
