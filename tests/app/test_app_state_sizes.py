"""Per-session state stays small: after every endpoint of the app, every gr.State value the server holds for the
session pickles to at most 64 KB; the larger results live in the server-wide KeptStore, counted with their real
size, and a dropped entry is recomputed.

How the state is read: Gradio keeps a session's State values on the server, in `demo.state_holder`, under the
session's hash; a gradio_client Client is one session (its `session_hash`), and its calls fill that session's
States exactly as the page's do. So the test launches the app (tiny random models, as `python app.py` would
serve them), calls every public endpoint through gradio_client, and after each call pickles every value the
server holds for that session. The page's private steps that write a State (its first screens, a score picked
from the dropdown, a threshold released, the Generate tab's send) run through `demo.process_api` with that same
session's state: the path the queue takes for the page's own events. The test also fails when the app gains a
public endpoint it does not call.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

import gradio as gr  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402

from test_app_lab import LAB_ENV, fields  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402
from ui.services.generation import TraceRef  # noqa: E402
from ui.services.heads import HEADS_KEPT  # noqa: E402
from ui.services.kept import KeptRef, nbytes_of  # noqa: E402

MAX_STATE_BYTES = 64 * 1024
TEXT = ("The lighthouse keeper rowed out to the rocks at dawn. When the storm finally passed, she climbed the "
        "stairs and lit the lamp again, because the fishing boats were still out at sea. ") * 3
CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"
PROMPT = "The keeper lit the lamp"
LONG = 512  # new tokens: the most Generate writes, so its trace is as long as a trace gets
# the page's steps that need what only a page sends: a tab's select event, a clicked head, a shown generation
# (and the Patching tab's "how typical is this?" and shortcuts-over-the-IOI-pairs runs, whose first step sets the
# corpus to IOI pairs: the tiny tokenizer has no one-token names for them, and the field's first value, induction
# texts, holds no pairs), and why-this-edge after a click on the graph, which sets an edge the graph keeps
NEEDS_THE_PAGE = {"remember_tab", "open_head", "send_to_attention", "corpus_patch_1", "corpus_shortcuts_1",
                  "edge_attribution_1"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("state-sizes")
    with pytest.MonkeyPatch.context() as patch:  # the Lab's settings hold for the module, then go back
        for name, value in {**LAB_ENV, "ATTN_WEIGHTS_DIR": str(root / "weights"), "ATTN_RUNS_DIR": str(root / "runs")}.items():
            patch.setenv(name, value)
        llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
        demo, url, services = launch_app([llama, bert], llama)
        yield dict(demo=demo, url=url, services=services, llama=llama, bert=bert, root=root)
        demo.close()


def session_states(demo: gr.Blocks, session: str) -> dict[int, object]:
    """Every State value the server holds for the session, by component id."""
    state = demo.state_holder.session_data.get(session)
    return {} if state is None else dict(state.state_data)


def state_sizes(demo: gr.Blocks, session: str) -> dict[str, int]:
    """Pickled bytes of each State value the session holds, named by what the State belongs to."""
    sizes = {}
    for key, value in session_states(demo, session).items():
        sizes[f"{key}: {type(value).__name__}"] = len(pickle.dumps(value))
    return sizes


def calls(llama: str, upload: str) -> list[tuple[str, tuple]]:
    """Every public endpoint with arguments that succeed on the tiny Llama, in an order where each reads what an
    earlier one left (a generation before its step view, a run before its attention)."""
    attention = (llama, TEXT, 1, "2", False, 0, 0, 32)
    positions = (llama, 64, 32, 0, 5, 1, 2, TEXT)
    masks = (llama, TEXT, 1, 2, 0, 12, TEXT, "Rain again today.")
    settings = (llama, PROMPT, False, LONG, 0.0, 0, 1.0, 0)
    inside = (llama, TEXT[:60], 1, 2)
    return [
        ("load_model", (llama,)),
        ("load_text", (handle_file(upload),)),
        ("attention", attention),
        ("export_attention", (*attention, "head CSV")),
        ("positional_encoding", positions),
        ("permutation_check", (llama, TEXT)),
        ("position_bias", (llama, "alibi", "encoder", 16)),
        ("export_positions", positions),
        ("mask_demo", masks),
        ("export_masks", masks),
        ("window_mask", (llama, TEXT, 1, 2, 4, 1)),
        ("approximation", (llama, TEXT, "topk", {"k": 4}, "all")),
        ("attention_cost", (llama,)),
        ("head_atlas", (llama, TEXT, "previous_token", 1, 2)),
        ("export_heads", (llama, TEXT)),
        ("ablate_heads", (llama, TEXT, "1.2, 0.1", "zero")),
        ("ablation_sweep", (llama, TEXT, "zero", "previous_token")),
        ("attribute", (llama, TEXT, -1, 1, 2, 8, "", "", "pad")),
        ("logit_lens", (llama, TEXT)),
        ("surprisal", (llama, TEXT)),
        ("sink_scores", (llama, TEXT)),
        ("sink_comparison", (llama, TEXT)),
        ("streaming_perplexity", (llama, TEXT, 16, 4, "cache")),
        ("generate", settings),
        ("generation_trace", settings),
        ("generation_step", (3, 1, 2)),
        ("export_generation", ()),
        ("kv_cache", (llama, PROMPT)),
        ("patch_sweep", (llama, CLEAN, CORRUPTED, "", "", "resid_pre", "denoise", 0)),
        ("shortcut_report", (llama, CLEAN, CORRUPTED, "", "", "z", "denoise")),
        ("approximate_sweep", (llama, CLEAN, CORRUPTED, "", "", "z", "denoise", "atp")),
        ("logit_attribution", (llama, CLEAN, CORRUPTED, "", "")),
        ("flow_graph", (llama, CLEAN, 0.04)),
        ("score_anatomy", (*inside, -1, 0, "heads", True)),
        ("qk_geometry", inside),
        ("forward_walk", (*inside, -1, 1.0, 0, 1.0)),
        ("online_softmax", (*inside, -1, 4)),
        ("train", (*fields(), "10, 20")),
        ("compare", (*fields(), "causal_mask")),
        ("stop_training", ()),
        ("lab_runs", ()),
        ("lab_attention", ("run1", "abcdefghij")),
        ("save_run", ("run1", "sizes-run")),
        ("export_lab", ()),
        ("extrapolation", (["none"], 10, 0)),
        ("lab_sinks", (50, 0, 8)),
        ("lab_induction", ("saved: induction",)),
        ("lab_induction_train", (0, 100)),
        ("corpus_heads", (llama, "induction texts", 4, None, "induction", 0, 0)),
        ("corpus_attribution", (llama, "uploaded file", 3, handle_file(corpus_pairs(upload)), 0, 0)),
        ("corpus_patch", (llama, "uploaded file", 3, handle_file(corpus_pairs(upload)), "z", "denoise", 0, 0, 0)),
        ("corpus_shortcuts", (llama, "uploaded file", 2, handle_file(corpus_pairs(upload)), "denoise", 0, 0)),
        ("corpus_examples", (llama, "induction texts", 4, None, 1, 2, 5)),
        ("corpus_qk", (llama, "induction texts", 3, None, 1, 2)),
        ("corpus_ablation", (llama, "induction texts", 2, None, "zero", 0, 0)),
        ("lesson", (llama, "sqrt-dk")),
        ("composition_over", (llama, 1, 0, "key", 2)),
        ("qk_attribution", (llama, CLEAN, 1, 0, -1, 2, "heads", True)),
        ("edge_attribution", (llama, CLEAN, 0.0, 1, 8, 0)),     # the last token (of 9) reading the first
    ]


def corpus_pairs(upload: str) -> str:
    """A pairs file beside the uploaded text, for the corpus endpoints: the tiny tokenizer has no one-token names
    for IOI pairs, so its pairs are uploaded (nine tokens each, answer and foil one token each)."""
    path = os.path.join(os.path.dirname(upload), "pairs.jsonl")
    rows = [(CLEAN, CORRUPTED, " the", " bread"), ("a bread is warm and the lamp", "a bread is warm and the shop",
                                                    " bread", " the"),
            ("the bread is warm to the lamp", "the bread is warm to the shop", " and", " bread")]
    with open(path, "w", encoding="utf-8") as f:
        for clean, corrupted, answer, foil in rows:
            f.write(json.dumps(dict(clean=clean, corrupted=corrupted, answer=answer, foil=foil)) + "\n")
    return path


def public_endpoints(demo: gr.Blocks) -> set[str]:
    return {fn.api_name for fn in demo.fns.values() if fn.fn is not None and fn.api_visibility == "public"}


def private_state_writers(demo: gr.Blocks) -> list:
    """The page's own steps (not callable by API clients) whose outputs include a State."""
    return [fn for fn in demo.fns.values() if fn.fn is not None and fn.api_visibility != "public"
            and any(isinstance(block, gr.State) for block in fn.outputs)]


def page_value(block):
    """What the page sends for a component that still shows its first value."""
    value = getattr(block, "value", None)
    return value() if callable(value) else value


def run_as_the_page(demo: gr.Blocks, fn, session: str) -> None:
    """One of the page's steps, run as the queue runs it: its States read from and written to the session."""
    state = demo.state_holder[session]
    inputs = [None if block.stateful else page_value(block) for block in fn.inputs]
    # on a thread of its own: after a browser test in the same process, Playwright's sync API keeps an event loop
    # running on this thread, where asyncio.run refuses to start another
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, demo.process_api(fn, inputs, state=state, request=None,
                                                  session_hash=session)).result()


# remember_tab called with no page has no tab's SelectData: Gradio fills it with None and warns, and the call is
# refused (it is one of NEEDS_THE_PAGE), as the test expects
@pytest.mark.filterwarnings("ignore:Unexpected argument. Filling with None.:UserWarning")
def test_every_state_stays_small_after_every_endpoint(served, tmp_path):
    demo, llama = served["demo"], served["llama"]
    upload = tmp_path / "text.txt"
    upload.write_text(TEXT, encoding="utf-8")
    planned = calls(llama, str(upload))
    assert {name for name, _ in planned} == public_endpoints(demo), "an endpoint without a call here, or a stale one"
    client = Client(served["url"], verbose=False)
    too_big = {}
    for name, args in planned:
        client.predict(*args, api_name=f"/{name}")
        for state, size in state_sizes(demo, client.session_hash).items():
            if size > MAX_STATE_BYTES:
                too_big[f"after /{name}, {state}"] = size
    held = session_states(demo, client.session_hash).values()
    # the large results were made, and are kept server-wide: the session holds only their tickets
    assert any(isinstance(v, TraceRef) and len(v.tokens) == LONG for v in held), list(held)
    assert any(isinstance(v, KeptRef) and v.key == HEADS_KEPT for v in held), list(held)
    ran = []
    for fn in private_state_writers(demo):
        try:
            run_as_the_page(demo, fn, client.session_hash)
        except Exception as exc:  # noqa: BLE001 - a step that needs the page's own event data: checked below
            ran.append(f"{fn.api_name}: {type(exc).__name__}")
            continue
        ran.append(fn.api_name)
        for state, size in state_sizes(demo, client.session_hash).items():
            if size > MAX_STATE_BYTES:
                too_big[f"after the page's {fn.api_name}, {state}"] = size
    assert not too_big, too_big
    refused = {name.split(":")[0] for name in ran if ":" in name}
    assert refused <= NEEDS_THE_PAGE and len(ran) > 20, ran
    assert {"open_attention", "open_heads", "head_atlas_1", "pick_top", "flow_graph_1"} <= set(ran), ran


def drop_everything(services) -> None:
    """Another session takes the whole budget: every kept entry is dropped, least recently used first."""
    services.kept.put("another session", ("x",), None, services.kept.budget_bytes)


def test_the_heads_cache_is_counted_with_its_real_size_and_a_dropped_one_is_recomputed(served):
    demo, services, llama = served["demo"], served["services"], served["llama"]
    client = Client(served["url"], verbose=False)
    first = client.predict(llama, TEXT, "previous_token", 1, 2, api_name="/head_atlas")
    client.predict(llama, TEXT, api_name="/logit_lens")
    ref = next(v for v in session_states(demo, client.session_hash).values()
               if isinstance(v, KeptRef) and v.key == HEADS_KEPT)
    cache = services.kept.find(ref)
    assert cache is not None and cache.lens is not None and cache.scores is not None
    # counted as the sum of its tensors' numel × element size (and its texts), as the store holds it
    entry = services.kept._entries[ref.ticket]
    tensors = sum(t.numel() * t.element_size() for t in cache.scores.values())
    assert entry[2] == nbytes_of(cache) > tensors > 0
    drop_everything(services)
    assert services.kept.find(ref) is None
    again = client.predict(llama, TEXT, "previous_token", 1, 2, api_name="/head_atlas")
    assert again[1] == first[1]  # the same map, recomputed
    assert services.kept.find(ref) is not None  # and kept again under the session's ticket


def test_a_dropped_generation_trace_is_recomputed_and_its_step_view_says_why(served):
    from gradio_client.exceptions import AppError

    demo, services, llama = served["demo"], served["services"], served["llama"]
    client = Client(served["url"], verbose=False)
    settings = (llama, PROMPT, False, 12, 0.0, 0, 1.0, 0)
    first = client.predict(*settings, api_name="/generation_trace")
    ref = next(v for v in session_states(demo, client.session_hash).values() if isinstance(v, TraceRef))
    bank = services.kept.find(ref)
    assert bank["trace"].tokens == list(ref.tokens) and len(ref.tokens) == 12
    assert services.kept._entries[ref.ticket][2] == nbytes_of(bank)  # rows, probabilities and texts, counted
    drop_everything(services)
    with pytest.raises(AppError, match="dropped to keep the server's memory within its budget"):
        client.predict(3, 1, 2, api_name="/generation_step")
    again = client.predict(*settings, api_name="/generation_trace")
    assert again == first  # the same tokens and probabilities, generated again
    step = client.predict(3, 1, 2, api_name="/generation_step")
    assert "Step 3" in step[0]
