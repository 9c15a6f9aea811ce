"""Inside tab: one real forward pass, stage by stage, for one head and its layer on a short text (tokens, embeddings
and positions, norm, Q/K/V, RoPE, scores and softmax, the output and the residual, the feed-forward, logits and
sampling), then why the head attends from one token to another. Layout and wiring only."""

from __future__ import annotations

import gradio as gr

from ui.services.generation import MAX_TEMPERATURE
from ui.services.inside import MAX_INSIDE_TOKENS, shape_of
from ui.tabs.events import ON_ANALYSIS, handler, opening, user_errors
from ui.tabs.widgets import Tab, click_bridge, layer_head, run_checked, upload
from ui.views import inside as views
from ui.views.learn.cost import cost_markdown
from ui.views.online import online_view

LEAD = """**Inside one forward pass**: follow one token through one real layer, stage by stage, with every number the
model computed; then ask why a head attends from one token to another."""
HOW_TO_READ = """Each stage below has its equation, its shapes, the real numbers as a figure (hover for values; one row
per token, ▶ marks the token you follow) and one measured thing to notice."""
TEXT = "The keeper lit the lamp, and the lamp lit the bay."
# a click on a cell of stage 5 (x and y are "position token" labels) reads "query.key"
CELL_READ = ('if (point.data.type !== "heatmap") return null; const q = parseInt(String(point.y)), '
             'k = parseInt(String(point.x)); return Number.isNaN(q) || Number.isNaN(k) ? null : `${q}.${k}`;')

SOFTMAX_STAGE = 5  # the walk's stage of the scores and the softmax; the online softmax sits under it


def build(services, picker, initial) -> Tab:
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text = gr.Textbox(label=f"Text (its first {MAX_INSIDE_TOKENS} tokens)", value=TEXT, lines=3,
                              max_lines=14, elem_id="inside-text")
            fields = layer_head(services.models, picker, initial, "inside", shape=shape_of)
            layer, head = fields.layer, fields.head
            token = gr.Number(value=-1, label="Token to follow (position; −1 = the last)", precision=0,
                              elem_id="inside-token")
            run = gr.Button("Walk through", variant="primary", elem_id="inside-run")
            with gr.Accordion("Sampling at the last stage", open=False, elem_id="inside-sampling"):
                with gr.Row():
                    temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=1.0, step=0.05, label="Temperature (0–2)",
                                            elem_id="inside-temperature", min_width=120)
                    top_k = gr.Number(value=0, label="Top-k (0 = off)", precision=0, elem_id="inside-top-k",
                                      min_width=100)
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p (0.05–1)",
                                      elem_id="inside-top-p", min_width=120)
            upload(text, "inside", services.settings.text_cap_bytes)
            npz = gr.File(label="Every stage's numbers (.npz)", interactive=False, elem_id="inside-file", height=80,
                          visible=False)
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            overview = gr.Markdown(elem_id="inside-note")
            stages = []
            for i in range(1, views.STAGE_COUNT + 1):
                stages.append(gr.Markdown(elem_id=f"inside-note{i}"))
                stages.append(gr.Plot(elem_id=f"inside-stage{i}", visible=False, show_label=False))
                if i == SOFTMAX_STAGE:
                    online = online_section(services, picker, text, fields, token)
    why = why_section(services, picker, text, fields)
    why["results"] += online["results"]
    why["press"].update(online["press"])
    walk = dict(fn=handler(views.walk_view, services, "forward_walk"),
                inputs=[picker.model, text, layer, head, token, temperature, top_k, top_p],
                outputs=[overview, *stages, npz], **ON_ANALYSIS)
    figures = [c for c in stages if isinstance(c, gr.Plot)]
    # a wrong layer or head is a note under them, and the stages keep the last walk
    run_checked(run.click, services.models, picker.model, fields, walk, reveal=[*figures, npz],
                api_name="forward_walk")
    for control in (temperature, top_p):
        run_checked(control.release, services.models, picker.model, fields, walk, api_visibility="private")

    @user_errors
    def pick(value):
        query, key = (int(part) for part in str(value).split("."))
        return query, key, gr.Plot(visible=True), gr.Plot(visible=True)

    why["picked"].click(pick, why["picked"], [why["query"], why["key"], *why["event"]["outputs"][1:]],
                        api_visibility="private", queue=False).then(**why["event"], api_visibility="private")
    # the tab opens on the default text's stages, computed once per model for every visitor; the .npz expires, so
    # each page gets its own with its first walk
    return Tab(text=text, layer=layer, head=head, token=token, reveal=figures,
               opening=opening(services, "inside", walk, fresh=(len(walk["outputs"]) - 1,)),
               follows=True, results=why["results"], press={overview: run, **why["press"]}, parts=online["parts"])


def why_section(services, picker, text, fields) -> dict:
    gr.Markdown("### Why this head attends here\nA score q·k/√d_k split into what each side's residual stream is made "
                "of (the embeddings, the positions, every earlier layer's attention, or each of its heads, and MLP "
                "output), content against position for every key, and the head's queries and keys in one plane. "
                "Against the query's mean key, the split says why this key wins: softmax reads only differences. "
                "Click a cell of stage 5's weights to ask about it.")
    with gr.Row():
        query = gr.Number(value=-1, label="Query (position; −1 = the last)", precision=0, elem_id="inside-query")
        key = gr.Number(value=0, label="Key (position)", precision=0, elem_id="inside-key")
        button = gr.Button("Why this weight?", elem_id="inside-why-run")
        geometry_button = gr.Button("Queries and keys in one plane", elem_id="inside-geometry-run")
    with gr.Row():
        split = gr.Radio(["layers", "heads"], value="layers", label="Split the score by (heads: each earlier layer's "
                         "heads one by one)", elem_id="inside-why-split")
        relative = gr.Checkbox(value=False, label="Against the query's mean key (what makes this key win)",
                               elem_id="inside-why-relative")
    note = gr.Markdown(elem_id="inside-why-note")
    with gr.Row():
        decomposition = gr.Plot(elem_id="inside-decomposition", visible=False, show_label=False)
        lines = gr.Plot(elem_id="inside-content-position", visible=False, show_label=False)
    geometry_note = gr.Markdown(elem_id="inside-geometry-note")
    scatter = gr.Plot(elem_id="inside-geometry", visible=False, show_label=False)
    picked = click_bridge("inside-cell-bridge", ["inside-stage5"], CELL_READ)
    layer, head, models = fields.layer, fields.head, services.models
    event = dict(fn=handler(views.anatomy_view, services, "score_anatomy"),
                 inputs=[picker.model, text, layer, head, query, key, split, relative],
                 outputs=[note, decomposition, lines],
                 **ON_ANALYSIS)
    run_checked(button.click, models, picker.model, fields, event, reveal=[decomposition, lines],
                api_name="score_anatomy")
    qk_attribution_endpoint(services)
    geometry = dict(fn=handler(views.geometry_view, services, "qk_geometry"), inputs=[picker.model, text, layer, head],
                    outputs=[geometry_note, scatter], **ON_ANALYSIS)
    run_checked(geometry_button.click, models, picker.model, fields, geometry, reveal=[scatter],
                api_name="qk_geometry")
    return dict(query=query, key=key, picked=picked, event=event,
                results=[note, decomposition, lines, geometry_note, scatter],
                press={note: button, geometry_note: geometry_button})


def online_section(services, picker, text, fields, token) -> dict:
    """The followed token's softmax read a block of keys at a time (eq. 6.10), under the softmax stage."""
    with gr.Accordion("The same softmax, online: a block of keys at a time (FlashAttention, eq. 6.10)", open=False,
                      elem_id="inside-online") as box:
        with gr.Row():
            block = gr.Number(value=4, label="Block size (keys per step)", precision=0, elem_id="inside-online-block",
                              min_width=140)
            button = gr.Button("Softmax block by block", elem_id="inside-online-run")
        note = gr.Markdown(elem_id="inside-online-note")
        figure = gr.Plot(elem_id="inside-online-figure", visible=False, show_label=False)
        table = gr.Markdown(elem_id="inside-online-bytes")
        gr.Markdown(cost_markdown(), elem_id="inside-attention-cost")
    event = dict(fn=handler(online_view, services, "online_softmax"),
                 inputs=[picker.model, text, fields.layer, fields.head, token, block], outputs=[note, figure, table],
                 **ON_ANALYSIS)
    run_checked(button.click, services.models, picker.model, fields, event, reveal=[figure],
                api_name="online_softmax")
    return dict(results=[note, figure, table], press={note: button},
                parts={"inside-online-figure": ({**event, "api_visibility": "private"}, [box, figure])})


def qk_attribution_endpoint(services) -> None:
    """`qk_attribution`, an API-only endpoint: the score split by heads (or layers) as numbers, no figure."""
    data = handler(views.qk_attribution_data, services, "qk_attribution", progress=False)

    def qk_attribution(model_name: str, text_value: str, layer_index: int, head_index: int, query_index: int,
                       key_index: int, split: str = "heads", relative: bool = False) -> dict:
        return data(model_name, text_value, layer_index, head_index, query_index, key_index, split, relative)

    gr.api(qk_attribution, api_name="qk_attribution", concurrency_id=ON_ANALYSIS["concurrency_id"],
           concurrency_limit=ON_ANALYSIS["concurrency_limit"])
