"""The model picker above the tabs, and the model card (config and where the parameters sit) in a section that
opens on demand, so the tabs start near the top of the page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from ui.tabs.events import ON_ANALYSIS, Steps, progress_callback, user_errors
from ui.views.card import model_card


@dataclass
class Picker:
    model: gr.Dropdown
    card: gr.Markdown
    load_card: Callable  # name → card markdown; the page runs it when it opens
    loaded: object  # the event of a successful model change
    choices: Callable  # (request) → the dropdown with the store's current names (models saved or copied in since
    # start, each marked when not installed) and, on a shared server, the session's own saved runs
    after: Steps  # what the tabs do once a model change has loaded it (add a step; the page wires them as one)


def build(models, default_model: str, beside: Callable[[], None] | None = None,
          private: Callable[[str | None], list[str]] | None = None) -> Picker:
    """The picker in a row (with whatever `beside` builds to its right), then the card, closed. private(session):
    the names only that session's picker lists (its saved Lab runs on a shared server)."""
    with gr.Row(equal_height=False, elem_id="page-top"):
        with gr.Column(scale=2, min_width=260):
            model = gr.Dropdown(
                choices=models.choices(),  # (label, name): the value stays the plain name
                value=default_model,
                label="Model",
                info="Installed and known models; one marked not installed is fetched when chosen.",
                elem_id="model-picker",
            )
        if beside is not None:
            with gr.Column(scale=3, min_width=260):
                beside()
    with gr.Accordion("Model card: config, parameters, where the weights came from", open=False,
                      elem_id="model-card-box"):
        card = gr.Markdown(label="model card", elem_id="model-card")

    @user_errors
    def load_card(model_name: str, progress=gr.Progress()):
        model_obj = models.get(model_name, progress_callback(progress))
        return model_card(model_name, model_obj, models.source(model_name))

    def choices(request: gr.Request = None):
        own = private(getattr(request, "session_hash", None)) if private is not None and request is not None else []
        return gr.Dropdown(choices=[*models.choices(), *((alias, alias) for alias in own)])

    loaded = model.change(load_card, model, card, api_name="load_model", **ON_ANALYSIS)
    return Picker(model, card, load_card, loaded, choices, Steps("follow_model"))
