"""The model picker above the tabs, and the model card: config and where the parameters sit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from ui import service
from ui.common import ANALYSIS, ANALYSIS_LIMIT, progress_callback, user_errors


@dataclass
class Picker:
    model: gr.Dropdown
    card: gr.Markdown
    load_card: Callable  # name → card markdown; app.py runs it when a page opens
    loaded: object  # the event of a successful model change: tabs chain their updates on it with .success


def build(store: service.ModelStore, default_model: str) -> Picker:
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=260):
            model = gr.Dropdown(
                choices=store.names(),
                value=default_model,
                label="Model",
                info="Installed and known models; a missing one is fetched when chosen.",
                elem_id="model-picker",
            )
        with gr.Column(scale=3):
            card = gr.Markdown(label="model card", elem_id="model-card")

    @user_errors
    def load_card(model_name: str, progress=gr.Progress()):
        model_obj = store.get(model_name, progress_callback(progress))
        return service.model_card(model_name, model_obj, store.source(model_name))

    loaded = model.change(
        load_card, model, card, api_name="load_model", concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT
    )
    return Picker(model, card, load_card, loaded)
