"""Generate tab: the model writes, token by token, with the KV-cached decoder of the core."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ui import service
from ui.common import progress_callback, read_example, text_with_upload, user_errors
from ui.model_picker import Picker

GENERATE = "generate"
GENERATE_LIMIT = 2  # two users can generate at once; more wait in the queue


@dataclass
class GenerateTab:
    sent: gr.State  # prompt + continuation as the model read it, for the Attention tab
    send: gr.Button


def build(store: service.ModelStore, picker: Picker, initial) -> GenerateTab:
    model = picker.model
    gr.Markdown(
        "The model extends the prompt one token at a time. Greedy (temperature 0) always picks the most likely "
        "token; higher temperatures, top-k and top-p sample. A seed makes sampling repeat exactly."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt, _ = text_with_upload("Prompt", read_example("generate.txt"), "gen", lines=4)
            chat = gr.Checkbox(
                value=bool(getattr(initial.tokenizer, "chat_template", None)),
                label="Chat mode (wrap the prompt in the model's chat template)",
                elem_id="gen-chat",
            )
        with gr.Column(scale=2):
            max_new = gr.Slider(
                1, service.MAX_GENERATE_TOKENS, value=64, step=1, label="Max new tokens", elem_id="gen-max-new"
            )
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            with gr.Row():
                top_k = gr.Number(value=0, label="Top-k (0 = off)", precision=0)
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p (1 = off)")
                seed = gr.Number(value=0, label="Seed", precision=0)
            with gr.Row():
                run = gr.Button("Generate", variant="primary", elem_id="gen-run")
                stop = gr.Button("Stop", variant="stop", elem_id="gen-stop")
    output = gr.Textbox(label="Continuation", lines=8, interactive=False, elem_id="gen-output")
    stats = gr.Markdown(label="stats", elem_id="gen-stats")
    send = gr.Button("Send prompt + continuation to the Attention tab", elem_id="gen-send")
    sent = gr.State("")

    @user_errors
    def generate(
        model_name,
        prompt_text,
        chat_mode,
        max_new_tokens,
        temperature_value,
        top_k_value,
        top_p_value,
        seed_value,
        progress=gr.Progress(),
    ):
        model_obj = store.get(model_name, progress_callback(progress))
        update = None
        for update in service.stream_generation(
            model_obj, prompt_text, chat_mode, max_new_tokens, temperature_value, top_k_value, top_p_value, seed_value
        ):
            yield update.new_text, stats_line(update), update.prompt_text + update.new_text
        if update is None:
            yield "", "Nothing was generated.", ""

    event = run.click(
        generate,
        [model, prompt, chat, max_new, temperature, top_k, top_p, seed],
        [output, stats, sent],
        api_name="generate",
        concurrency_id=GENERATE,
        concurrency_limit=GENERATE_LIMIT,
    )
    # cancel first, then relabel: an update still in flight from the stream must not overwrite "stopped"
    stop.click(None, None, None, cancels=[event], api_visibility="private").then(
        mark_stopped, stats, stats, api_visibility="private", queue=False
    )

    @user_errors
    def chat_default(name):
        tok = store.get(name).tokenizer
        return gr.Checkbox(value=bool(getattr(tok, "chat_template", None)))

    picker.loaded.success(chat_default, model, chat, api_visibility="private")
    return GenerateTab(sent=sent, send=send)


def mark_stopped(stats: str) -> str:
    return stats.replace("writing…", "stopped") if "writing…" in stats else stats


def stats_line(update: service.GenerationUpdate) -> str:
    state = f"done ({update.stop_reason})" if update.done else "writing…"
    line = f"**{update.n_new}** tokens in {update.seconds:.2f} s, **{update.tokens_per_second:.1f} tokens/s**; {state}"
    return line + (f"  \n⚠️ {update.note}" if update.note else "")
