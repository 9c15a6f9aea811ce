"""The model work on Ray Serve (ui/backend/ray_serve.py) gives the same answers as the app in one process.

A local Ray instance (127.0.0.1, 2 CPUs, no dashboard) runs two replicas of a tiny Llama deployed through
`python app.py --backend ray`'s own path (app.parse_args, app.ray_backend, ui.backend.routing.route); the front
is launched on a free loopback port and driven with gradio_client beside the in-process app on the same model:
every figure and text must be identical (timings aside). A corpus job sent to the replicas in chunks must give the
one-process run's summary (within 1e-5). Ray starts once for the module. The tests of the seam
itself (ui/backend.py) need no Ray and always run.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

import gradio as gr  # noqa: E402
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.corpus import Pair  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui.backend import routing as model_backend  # noqa: E402
from ui.backend.ray_serve import replica_page  # noqa: E402
from ui.page import build_page  # noqa: E402
from ui.services import Services  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."
SECONDS = re.compile(r"\d+(\.\d+)? ?(s|ms)\b|[\d.]+ tokens/s")  # timings differ between any two runs


def test_the_default_install_never_imports_ray():
    code = "import app, sys; assert 'ray' not in sys.modules, 'app imported ray'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_ray_options_need_the_ray_backend():
    import app

    with pytest.raises(SystemExit):
        app.parse_args(["--replicas", "2"])
    assert app.parse_args([]).backend == "local"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("ray-models") / "tiny-llama"))


@pytest.fixture(scope="module")
def local(llama):
    demo, url, _ = launch_app([llama], llama)
    yield url  # each test opens its own session: what a session kept changes the notes
    demo.close()


class Pickled:
    """A backend that runs a second page in this process with every argument and reply pickled on the way,
    as a replica does: the seam's proxies, argument dropping, files and errors, without Ray."""

    def __init__(self, model_name: str):
        self.events = replica_page(model_name)

    def call(self, key, model_name, args, session=None):
        args = pickle.loads(pickle.dumps(args))
        return model_backend.received(pickle.loads(pickle.dumps(model_backend.run_event(self.events, key, args))))

    def stream(self, key, model_name, args, session=None):
        for update in model_backend.stream_event(self.events, key, pickle.loads(pickle.dumps(args))):
            yield model_backend.received(pickle.loads(pickle.dumps(update)))

    def close(self):
        pass


def test_every_model_event_can_travel(llama):
    demo = build_page(Services.create(default_model=llama), llama)
    events = model_backend.model_events(demo)
    names = {key.split(":", 1)[1] for key in events}
    assert {"attention", "generate", "positional_encoding", "mask_demo", "head_atlas", "ablation_sweep",
            "kv_cache", "generation_step", "export_generation", "export_attention"} <= names
    assert not names & {"train", "compare", "save_run", "load_text", "show_strip"}  # no model work there
    generate = next(e for k, e in events.items() if k.endswith(":generate"))
    assert generate.generator and generate.n_args == 9 and generate.model_input == 0  # progress stays behind


def test_a_second_page_behind_pickles_answers_as_this_one(llama, local):
    """The front on meta-device models (no weights), its model events answered by another page."""
    import app

    args = app.parse_args(["--model", llama])
    args.backend = "ray"  # the front's store as --backend ray builds it, without Ray
    services = Services.create(app.app_settings(args), default_model=llama)
    assert next(services.models.get(llama).parameters()).device.type == "meta"
    demo = build_page(services, llama)
    model_backend.route(demo, Pickled(llama), llama)
    demo.queue(max_size=app.QUEUE_SIZE, default_concurrency_limit=1)
    _, url, _ = demo.launch(**app.launch_options(app.parse_args(["--port", str(free_port())]), services.settings),
                            prevent_thread_lock=True, quiet=True)
    try:
        same_answers(Client(url, verbose=False), Client(local, verbose=False), llama)
    finally:
        demo.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_front(llama):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -r requirements-scale.txt")
    import app

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    backend = None
    try:
        args = app.parse_args(["--backend", "ray", "--replicas", "2", "--num-cpus", "0.5", "--model", llama,
                               "--port", str(free_port())])
        services = Services.create(app.app_settings(args), default_model=llama)
        services.models.get(llama)
        backend = app.ray_backend(args)
        demo = build_page(services, llama)
        model_backend.route(demo, backend, llama)
        demo.queue(max_size=app.QUEUE_SIZE, default_concurrency_limit=1)
        _, url, _ = demo.launch(**app.launch_options(args, services.settings), prevent_thread_lock=True, quiet=True)
        yield demo, Client(url, verbose=False), backend
        demo.close()
    finally:
        if backend is not None:
            backend.close()
        ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_two_replicas_on_ray_serve_answer_as_the_app_in_one_process(ray_front, local, llama):
    from ray import serve

    _, client, _ = ray_front
    apps = [app for name, app in serve.status().applications.items() if name.startswith("attn-")]
    assert len(apps) == 1 and apps[0].deployments["model"].replica_states.get("RUNNING") == 2
    same_answers(client, Client(local, verbose=False), llama)


@pytest.mark.ray
@pytest.mark.slow
def test_a_session_keeps_its_replica(ray_front, llama):
    """Serve routes a session's calls to the replica that kept its capture: the second call reuses it."""
    _, client, _ = ray_front
    for layer in (0, 1, 0, 1):
        note = client.predict(llama, TEXT, layer, "1", False, 0, 0, 8, api_name="/attention")[0]
    assert "kept from the last run" in note, note


def same_answers(remote: Client, local: Client, model: str) -> None:
    """The representative calls, compared with the in-process app's (timings removed from the texts)."""
    args = (model, TEXT, 1, "2", False, 3, 1, 8)
    assert_same(remote.predict(*args, api_name="/attention"), local.predict(*args, api_name="/attention"))

    settings = (model, "The keeper", False, 12, 0.0, 0, 1.0, 0)
    streamed = [update[0] for update in remote.submit(*settings, api_name="/generate")]
    assert len(streamed) > 2 and streamed == [update[0] for update in local.submit(*settings, api_name="/generate")]
    # the step view reads the rows the generation kept on the replica that ran it
    assert_same(remote.predict(3, 1, 2, api_name="/generation_step"),
                local.predict(3, 1, 2, api_name="/generation_step"))

    args = (model, 64, 32, 5, 7, 1, 2, TEXT)
    assert_same(remote.predict(*args, api_name="/positional_encoding"),
                local.predict(*args, api_name="/positional_encoding"))
    args = (model, TEXT, 1, 2, 0, 12, TEXT, "The keeper")
    assert_same(remote.predict(*args, api_name="/mask_demo"), local.predict(*args, api_name="/mask_demo"))

    # an export written on the replica comes back as a file of the front's
    args = (model, TEXT, 1, "2", False, 0, 0, 8, "head CSV")
    remote_file, remote_note = remote.predict(*args, api_name="/export_attention")
    local_file, local_note = local.predict(*args, api_name="/export_attention")
    assert Path(remote_file).read_bytes() == Path(local_file).read_bytes() and remote_note == local_note

    messages = []
    for client in (remote, local):
        with pytest.raises(AppError) as err:
            client.predict(model, TEXT, 99, "0", False, 0, 0, 8, api_name="/attention")
        messages.append(str(err.value))
    assert "Layer" in messages[0] and messages[0] == messages[1]


def assert_same(remote, local) -> None:
    assert len(remote) == len(local)
    for a, b in zip(remote, local):
        assert comparable(a) == comparable(b)


def comparable(value):
    if isinstance(value, dict) and value.get("type") == "plotly":
        return json.loads(value["plot"])
    if isinstance(value, str):
        return SECONDS.sub("<time>", value)
    return value


@pytest.mark.ray
def test_the_replicas_get_the_fronts_allocator_settings(monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed: pip install -r requirements-scale.txt")
    from ui.backend import ray_serve

    started = {}
    monkeypatch.setattr(ray_serve.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_serve.ray, "init", lambda **options: started.update(options))
    monkeypatch.setattr(ray_serve.serve, "start", lambda **options: None)
    monkeypatch.setenv("ATTN_MALLOC_MMAP_KB", "128")
    ray_serve.connect(None)
    env_vars = started["runtime_env"]["env_vars"]
    assert env_vars["ATTN_MALLOC_MMAP_KB"] == "128" and env_vars["PYTHONPATH"] == str(ROOT)
    assert started["_node_ip_address"] == "127.0.0.1"  # a Ray started here stays on loopback


def test_a_replica_error_is_the_pages_message():
    event = model_backend.ModelEvent("1:x", lambda: None, False, 0, None, ())
    shipped = pickle.loads(pickle.dumps(model_backend.RemoteError("Layer must be 0–1, got 99.")))
    with pytest.raises(gr.Error, match="Layer must be"):
        model_backend.received(shipped)
    assert model_backend.reply(event, ("a", 1)) == ("a", 1)


# ---------------------------------------------------------------- corpus jobs in chunks on the replicas


def corpus_ids(model, n: int = 7) -> tuple[list, list]:
    """Random texts (every other one a span repeated once, for induction) and pairs of one differing token."""
    gen = torch.Generator().manual_seed(0)
    top = model.config.vocab_size - 1
    texts = []
    for i in range(n):
        span = torch.randint(3, top, (5 + i % 3,), generator=gen)
        texts.append(torch.cat([span, span]) if i % 2 == 0 else torch.randint(3, top, (11,), generator=gen))
    pairs = []
    for _ in range(n):
        clean = torch.randint(3, top, (8,), generator=gen)
        corrupted = clean.clone()
        corrupted[3] = (clean[3] + 5) % (top - 3) + 3
        pairs.append(Pair(clean, corrupted, 11, 23))
    return texts, pairs


def assert_same_over(got, want) -> None:
    for name in ("mean", "low", "high", "per_item"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-5, rtol=0, equal_nan=True)
    assert (got.n, got.items, got.note) == (want.n, want.items, want.note)


@pytest.mark.ray
@pytest.mark.slow
def test_a_corpus_job_in_chunks_on_the_replicas_is_the_local_run(ray_front, llama):
    """The same chunks sent to the two replicas give the one-process run's Over (head scores, attribution; and
    patching every head, against the same chunks run here); a stop keeps the finished chunks; a replica's refusal
    comes back in its words."""
    from core.analysis import over as overs
    from core.corpus import chunks, saved

    _, _, backend = ray_front
    runner = backend.corpus_chunks(llama)
    assert runner.in_flight == 4                                     # two replicas × two requests each
    model = Services.create(default_model=llama).models.get(llama)  # the replicas' model, loaded here
    texts, pairs = corpus_ids(model)
    patching = dict(site="z", mode="noise", layer=None)
    # patching against the same chunks run here: its scores divide by a pair's clean − corrupted difference, as
    # small as 0.004 on this random model, so a batch of other pairs' float rounding (1e-7) moves them by 1e-4
    # (tests/core/test_corpus_chunks.py shows chunks equal to one run on a model where the division is tame)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as on each replica (Ray gives a worker of 0.5 CPU one thread): the same sums
    try:
        here = chunks.merge(chunks.check(overs.ANALYSES["patch"], model, pairs, **patching),
                            [chunks.Chunk(tuple(part), chunks.run_chunk(overs.ANALYSES["patch"], model, [pairs[i] for i in part],
                                                                        **patching).result)
                             for part in chunks.split(len(pairs), 3)], "pair", len(pairs))
    finally:
        torch.set_num_threads(threads)
    jobs = (("head_scores", "text", texts, {}, overs.head_scores_over(model, texts)),
            ("logit_attribution", "pair", pairs, {}, overs.logit_attribution_over(model, pairs)),
            ("patch", "pair", pairs, patching, here))
    for analysis, noun, items, arguments, local in jobs:
        def submit(part, analysis=analysis, items=items, arguments=arguments):
            return runner.submit(analysis, [items[i] for i in part], arguments)

        finished = list(chunks.as_finished(submit, chunks.split(len(items), 3), runner.in_flight, noun))
        assert sorted(len(chunk.items) for chunk in finished) == [1, 3, 3]
        merged = chunks.merge(chunks.check(overs.ANALYSES[analysis], model, items, **arguments), finished, noun, len(items))
        local_parts, merged_parts = saved.parts_of(local), saved.parts_of(merged)
        assert set(merged_parts) == set(local_parts)
        for name, over in local_parts.items():
            assert_same_over(merged_parts[name], over)

    kept = []
    for chunk in chunks.as_finished(lambda part: runner.submit("head_scores", [texts[i] for i in part], {}),
                                    chunks.split(len(texts), 1), 1, "text", stop=lambda: bool(kept)):
        kept.append(chunk)
    stopped = chunks.merge(chunks.check(overs.ANALYSES["head_scores"], model, texts), kept, "text", len(texts), stopped=True)
    assert stopped["previous_token"].items == (0,) and "stopped after 1 of 7 texts" in stopped["previous_token"].note
    with pytest.raises(ValueError, match="got 'attention'"):
        runner.submit("attention", texts[:1], {}).result(timeout=120)


@pytest.mark.ray
@pytest.mark.slow
def test_the_across_texts_tab_on_ray_sends_its_job_in_chunks(ray_front, llama, tmp_path, monkeypatch):
    """The front reads the corpus, sends it to the replicas in chunks of two, and shows the one-process summary;
    the finished job is saved on the front."""
    from core.analysis import over as overs
    from core.corpus import texts as corpora
    from ui.backend import ray_serve
    from ui.services.corpus.over import INDUCTION_LENGTH

    _, client, backend = ray_front
    monkeypatch.setenv("ATTN_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(backend.options, "chunk_items", 2)
    sent = []
    submit = ray_serve.ServeChunks.submit

    def recording(self, analysis, items, arguments):
        sent.append((analysis, len(items)))
        return submit(self, analysis, items, arguments)

    monkeypatch.setattr(ray_serve.ServeChunks, "submit", recording)
    note, mean_figure, _ = client.predict(llama, "induction texts", 5, None, "induction", 1, 2,
                                          api_name="/corpus_heads")
    assert sent == [("head_scores", 2), ("head_scores", 2), ("head_scores", 1)]
    model = Services.create(default_model=llama).models.get(llama)
    texts = corpora.induction_texts(model.tokenizer, 5, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    over = overs.head_scores_over(model, texts)["induction"]
    heatmap = json.loads(mean_figure["plot"])["data"][0]
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), over.mean.float(),
                               atol=1e-5, rtol=0)
    assert "n = **5**" in note and "saved (in the runs folder" in note, note
    assert len(list((tmp_path / "runs").glob("*/meta.json"))) == 1


@pytest.mark.ray
@pytest.mark.slow
def test_a_job_stopped_on_the_replicas_resumes_sending_only_the_rest(ray_front, llama, tmp_path):
    """The front saves each chunk's items as it comes back; a rerun of the stopped job sends only the others and
    ends with the one-process summary."""
    from core.analysis import over as overs
    from core.corpus import saved
    from ui.services.corpus.chunked import chunks_on
    from ui.services.corpus.over import Corpus, stream_over

    import app

    _, _, backend = ray_front
    args = app.parse_args(["--model", llama])
    args.backend = "ray"
    front = Services.create(app.app_settings(args), default_model=llama).models.get(llama)   # the front's: no weights
    assert next(front.parameters()).device.type == "meta"
    model = Services.create(default_model=llama).models.get(llama)   # with weights: the one-process reference
    texts, _ = corpus_ids(model)
    runner = backend.corpus_chunks(llama)
    sent = []
    submit = runner.submit
    runner.submit = lambda analysis, items, arguments: sent.append(len(items)) or submit(analysis, items, arguments)
    runner.chunk_items, runner.in_flight = 2, 1
    corpus = Corpus(texts, "text", "seven texts")
    with chunks_on(runner):
        stopped = list(stream_over(front, "heads", corpus, root=tmp_path, model_name="tiny",
                                   stop=lambda: len(sent) > 1))[-1]
        assert "stopped; its finished items are kept" in stopped.saved, stopped.saved
        sent.clear()
        resumed = list(stream_over(front, "heads", corpus, root=tmp_path, model_name="tiny"))[-1]
    assert sent == [2, 2, 1] and "resumed from 2 items saved before" in resumed.saved
    for name, over in overs.head_scores_over(model, texts).items():
        assert_same_over(resumed.result[name], over)
    assert (resumed.folder / saved.META).is_file()


@pytest.mark.ray
@pytest.mark.slow
def test_top_examples_on_ray_are_the_local_ones_sent_as_token_ids(ray_front, local, llama, tmp_path, monkeypatch):
    """corpus_examples on the Ray front: the front reads the upload and sends its texts' ids in one call (no path
    reaches a replica, which may be on another node); the table is the in-process app's."""
    from ui.backend import ray_serve

    _, client, _ = ray_front
    sent = []
    examples = ray_serve.ServeChunks.examples

    def recording(self, texts, *rest):
        sent.append([type(text).__name__ for text in texts])
        return examples(self, texts, *rest)

    monkeypatch.setattr(ray_serve.ServeChunks, "examples", recording)
    path = tmp_path / "texts.txt"
    path.write_text(f"{TEXT}\nThe keeper lit the lamp, and the lamp lit the rocks.\n", encoding="utf-8")
    from gradio_client import handle_file

    args = (llama, "uploaded file", 5, handle_file(str(path)), 1, 2, 4)
    remote = client.predict(*args, api_name="/corpus_examples")
    assert sent == [["Tensor", "Tensor"]]
    assert_same(remote, Client(local, verbose=False).predict(*args, api_name="/corpus_examples"))


@pytest.mark.ray
@pytest.mark.slow
def test_an_ablation_and_a_qk_plane_on_ray_run_from_the_front(ray_front, local, llama, tmp_path, monkeypatch):
    """corpus_ablation on the Ray front: the front caps the texts (8 of 9), sends them in chunks and shows the
    one-process summary; the result is kept and saved on the front, so a cell click and Export work there.
    corpus_qk: one call with the texts' token ids (no path), the figure the in-process app's."""
    from core.analysis import over as overs
    from core.corpus import texts as corpora
    from ui.backend import ray_serve
    from ui.services.corpus.over import INDUCTION_LENGTH

    demo, client, backend = ray_front
    monkeypatch.setenv("ATTN_RUNS_DIR", str(tmp_path / "runs"))
    sent = []
    submit, qk = ray_serve.ServeChunks.submit, ray_serve.ServeChunks.qk
    monkeypatch.setattr(ray_serve.ServeChunks, "submit", lambda self, analysis, items, arguments:
                        sent.append((analysis, len(items))) or submit(self, analysis, items, arguments))
    monkeypatch.setattr(ray_serve.ServeChunks, "qk", lambda self, texts, *rest:
                        sent.append(("qk", {type(text).__name__ for text in texts})) or qk(self, texts, *rest))
    events = {block_fn.name: block_fn.fn for block_fn in demo.fns.values()}
    *_, (note, mean_figure, _, kept) = events["corpus_ablation"](llama, "induction texts", 9, None, "mean", 1, 0, None)
    assert sent == [("ablation", 1)] * 8                       # the first 8 texts, one sweep a call
    model = Services.create(default_model=llama).models.get(llama)
    texts = corpora.induction_texts(model.tokenizer, 9, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    over = overs.ablation_over(model, texts, "mean")
    heatmap = json.loads(mean_figure.plot)["data"][0]          # the event's PlotData, as Gradio sends it
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), over.mean.float(),
                               atol=1e-5, rtol=0)
    assert "n = **8**" in note and "swept the first 8 of 9 texts" in note and "limit=None" not in note, note
    assert "saved (in the runs folder" in note, note
    words, *_ = events["corpus_cell"](1, 3, kept)                                   # a click, on the front
    assert f"mean **{float(over.mean[1, 3]):+.4f}**" in words, words
    files, _ = events["corpus_export"](kept)
    assert any(str(path).endswith(".npz") for path in files) and all(Path(path).is_file() for path in files)

    sent.clear()
    args = (llama, "induction texts", 4, None, 1, 2)
    remote = client.predict(*args, api_name="/corpus_qk")
    assert sent == [("qk", {"Tensor"})]
    assert_same(remote, Client(local, verbose=False).predict(*args, api_name="/corpus_qk"))


def test_the_serve_config_sets_the_chunks_and_the_replicas_how_many_run(tmp_path):
    from ui.backend.ray_serve import ServeOptions, chunks_in_flight

    config = tmp_path / "serve.yaml"
    config.write_text("corpus_chunk_items: 4\nnum_replicas: 3\n", encoding="utf-8")
    options = ServeOptions.from_args(config_file=str(config))
    assert options.chunk_items == 4 and options.common == {"num_replicas": 3}   # not a deployment option
    assert chunks_in_flight(options.for_model("m")) == 6                          # three replicas × two requests
    assert chunks_in_flight({"num_replicas": "auto", "autoscaling_config": {"max_replicas": 5},
                             "max_ongoing_requests": 3}) == 15
    config.write_text("corpus_chunk_items: 0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="corpus_chunk_items is the number of items one call of a corpus job "
                                         "measures, a whole number ≥ 1, got 0"):
        ServeOptions.from_args(config_file=str(config))
