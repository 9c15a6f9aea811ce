"""A stranger's probe of a shared server (SPACE_ID set, as on a Space), through the service functions and through
gradio_client on the launched app: every endpoint's model is one the picker offers, and a refusal reads the same
for a server folder that exists and one that does not (nothing loads, nothing is fetched, the page's model stays);
on a laptop one folder spelled four ways is one model; a page's first corpus job stops saving at the page's cap
on saved bytes, keeping what fit, and is measured and shown whole (docs/app.md: a job past a cap is shown, not
saved); an upload's lone surrogate or too-deep line is named by its line; the corpus time cap,
read on a clock that ticks, is said on the page when it stops a job; and the extrapolation run stops at the same
cap with the kinds it finished."""

from __future__ import annotations

import functools
import json
import os
import re
from types import SimpleNamespace

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

import core.store as weight_store  # noqa: E402
from core.corpus import saved  # noqa: E402
from core.store.manifest import MANIFEST_FORMAT  # noqa: E402
from test_ray_corpus import ThreadChunks  # noqa: E402
from tiny import Ticking  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.services.checks import UserError  # noqa: E402
from ui.services.corpus.over import Corpus, chunks_on, stream_over  # noqa: E402
from ui.services.corpus.pages import Saving  # noqa: E402
from ui.services.lab import extrapolation as extra  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402
from ui.services.models import ModelStore  # noqa: E402
from ui.settings import AppSettings, LabSettings  # noqa: E402
from ui.views.lab import extrapolation_view  # noqa: E402

PAGE_BYTES = 50_000           # ATTN_PRIVATE_CORPUS_MB=0.05
MISSING = "/nonexistent-dir"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("probe-models") / "tiny-llama"))


@pytest.fixture(scope="module")
def space(tmp_path_factory, llama):
    root = tmp_path_factory.mktemp("probe-space")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPACE_ID", "someone/explorer")
        patch.setenv("ATTN_RUNS_DIR", str(root / "runs"))
        patch.setenv("ATTN_PRIVATE_CORPUS_MB", str(PAGE_BYTES / 1e6))
        demo, url, services = launch_app([llama], llama)
        yield SimpleNamespace(url=url, services=services, root=root, llama=llama)
        demo.close()


def refusal(call, name: str) -> str:
    """The message `call(name)` is refused with, the name itself replaced by NAME."""
    with pytest.raises((UserError, AppError)) as refused:
        call(name)
    text = str(refused.value).replace(repr(name[:60]), "NAME").replace(name, "NAME")
    return re.sub(r"Value: .*? is not in", "Value: NAME is not in", text)   # the name as the page shortens it


# ---- the one check of a model name ----

def test_a_shared_server_loads_only_the_names_it_offers_and_tells_nothing_of_its_files(llama, monkeypatch):
    store = ModelStore(extra_names=[llama], public=True)
    monkeypatch.setattr(weight_store, "ensure", lambda *a, **kw: pytest.fail("a refused name was looked up"))
    names = ["/etc", MISSING, "/tmp", "someone/some-model", llama + "/", llama + "/../tiny-llama",
             os.path.relpath(llama)]
    messages = {name: refusal(store.get, name) for name in names}
    assert len(set(messages.values())) == 1, messages           # one message, whatever exists on the server
    (message,) = set(messages.values())
    assert "not a model this server offers" in message and "exist" not in message and "/" not in message
    assert store.loaded() == []                                   # nothing loaded, nothing fetched
    assert store.get(llama) is store.get(llama) and store.loaded() == [llama]
    assert store.key("smollm2-135m-instruct") == "smollm2-135m-instruct"   # a registry name is offered


def test_a_shared_server_fetches_no_model_larger_than_its_cap(llama, tmp_path, monkeypatch):
    """A stranger's choice of a registry model that is not installed fetches it only when the registry records it
    at most ATTN_PUBLIC_FETCH_MB in memory: phi-3-mini (14,576 MB) and a model of no recorded size are refused in
    words before anything is fetched, and the picker does not offer them; installed, a model loads whatever its
    size; a laptop fetches any."""
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(tmp_path / "weights"))         # nothing installed
    fetched = []

    def fetch(name, **_):
        fetched.append(name)
        raise weight_store.WeightsUnavailable("no source in this test")

    monkeypatch.setattr(weight_store, "ensure", fetch)
    registry = weight_store.load_registry()
    assert registry["phi-3-mini-4k-instruct"]["memory_mb"] > 2000 and registry["gpt2"].get("memory_mb") is None
    assert registry["minilm-l6"]["memory_mb"] <= 2000
    services = Services.create(AppSettings(lab=LabSettings(private=True)), ModelStore(extra_names=[llama]))
    store = services.models
    assert store.max_fetch_mb == AppSettings().public_fetch_mb == 2000
    for name, words in (("phi-3-mini-4k-instruct", "about 14,576 MB in memory, more than the 2,000 MB"),
                        ("gpt2", "of no recorded size")):
        with pytest.raises(UserError, match=re.escape(words)) as refused:
            store.get(name)
        assert "ATTN_PUBLIC_FETCH_MB" in str(refused.value) and name not in store.names()
    assert fetched == [] and "minilm-l6" in store.names() and llama in store.names()
    with pytest.raises(UserError, match="no source in this test"):            # small enough: it is fetched
        store.get("minilm-l6")
    assert fetched == ["minilm-l6"]
    installed = tmp_path / "weights" / "phi-3-mini-4k-instruct"              # installed: no fetch, no refusal
    installed.mkdir(parents=True)
    (installed / weight_store.MANIFEST).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": {}}))
    assert store.fetch_refusal("phi-3-mini-4k-instruct") is None and "phi-3-mini-4k-instruct" in store.names()
    laptop = ModelStore(extra_names=[llama])
    assert laptop.fetch_refusal("phi-3-mini-4k-instruct") is None and "gpt2" in laptop.names()
    assert AppSettings.from_env({"ATTN_PUBLIC_FETCH_MB": "300"}).public_fetch_mb == 300


def test_a_server_built_for_strangers_checks_names_as_a_shared_one(llama):
    services = Services.create(AppSettings(lab=LabSettings(private=True)), ModelStore(extra_names=[llama]))
    assert services.models.public
    assert "not a model this server offers" in refusal(services.models.get, "/etc")
    assert not Services.create(AppSettings(), ModelStore(extra_names=[llama])).models.public


def test_on_a_laptop_one_folder_spelled_four_ways_is_one_model(llama, monkeypatch):
    monkeypatch.chdir(os.path.dirname(llama))
    store = ModelStore(capacity=2)
    spellings = [llama, llama + "/", "./tiny-llama", "tiny-llama/../tiny-llama"]
    models = [store.get(name) for name in spellings]
    assert all(model is models[0] for model in models)
    assert store.loaded() == [os.path.realpath(llama)]            # one copy, under the folder's own path
    given = ModelStore(extra_names=[llama])
    assert given.key("./tiny-llama/") == llama                    # a start-up folder keeps the name it was given
    with pytest.raises(UserError, match="does not exist"):       # a laptop's owner is told what is missing
        store.get(MISSING)


def test_the_lesson_endpoint_takes_the_pickers_choice(space):
    client = Client(space.url, verbose=False)
    lesson = syllabus.names()[0]
    before = space.services.models.loaded()

    def ask(name):
        return client.predict(name, lesson, api_name="/lesson")

    messages = {name: refusal(ask, name) for name in ["/etc", MISSING, space.llama + "/", "someone/some-model"]}
    # the same words for each (the list of choices that follows is cut to a length that depends on the name's)
    assert len({message.split("choices")[0] for message in messages.values()}) == 1, messages
    assert all("is not in the list of choices" in message for message in messages.values())
    assert space.services.models.loaded() == before               # no copy loaded, the page's model kept
    text, _, answer = ask(space.llama)
    assert "Lesson 1 of" in text and answer


# ---- a page's saved corpus jobs ----

def test_a_pages_first_job_stops_saving_at_the_pages_cap_and_is_shown_whole(space):
    texts = space.root / "many.txt"
    texts.write_text("".join(f"Line {i}: the keeper rowed out to the rocks and lit the lamp.\n" for i in range(120)),
                     encoding="utf-8")
    client = Client(space.url, verbose=False)
    note, _, _ = client.predict(space.llama, "uploaded file", 120, handle_file(str(texts)), "previous_token", 0, 0,
                                api_name="/corpus_heads")
    page = space.services.corpus_runs.saving(client.session_hash).root
    assert 0 < saved.disk_usage(page) <= PAGE_BYTES                # held while the job wrote, not only at its start
    assert "stopped saving" in note and "over a page's cap of 50.0 kB" in note, note
    assert "measured and shown, not saved" in note and "n = **120**" in note, note   # every text measured
    assert str(space.root) not in note                             # no server path
    (job,) = page.iterdir()
    assert 0 < len(list((job / "items").glob("*.npz"))) < 120 and not (job / saved.META).exists()


def test_a_job_in_chunks_stops_saving_at_the_cap_too(space, tmp_path):
    model = space.services.models.get(space.llama)
    ids = [model.tokenizer(f"Text {i} is short.", return_tensors="pt")["input_ids"][0] for i in range(8)]
    written = []

    def room(size: int) -> None:        # room for three items
        if size and len(written) == 3:
            raise saved.NoRoom("room for three items")
        written.extend([size] if size else [])

    runner = ThreadChunks(model, in_flight=1, chunk_items=2)
    with chunks_on(runner):
        updates = list(stream_over(model, "heads", Corpus(ids, "text", "8 short texts"),
                                   saving=Saving(tmp_path, room=room), model_name="tiny"))
    final = updates[-1]
    (job,) = tmp_path.iterdir()
    assert len(list((job / "items").glob("*.npz"))) == 3 and not (job / saved.META).exists()
    assert final.finished and final.folder is None and "stopped saving" in final.saved and "room for three" in \
        final.saved, final.saved
    assert final.result["previous_token"].n == 8 and len(runner.sent) == 4    # measured whole, not saved


def test_an_uploads_lone_surrogate_and_deep_line_are_named(space):
    client = Client(space.url, verbose=False)
    upload = space.root / "corpus.jsonl"
    upload.write_text('{"text": "a fine line"}\n{"text": "\\ud800 lone"}\n', encoding="utf-8")
    with pytest.raises(AppError, match=r"line 2: 'text' holds a lone surrogate \(\\ud800 at character 1\)"):
        client.predict(space.llama, "uploaded file", 5, handle_file(str(upload)), "previous_token", 0, 0,
                       api_name="/corpus_heads")
    upload.write_text('{"text": "a fine line"}\n' + "[" * 20_000 + "]" * 20_000 + "\n", encoding="utf-8")
    with pytest.raises(AppError, match="line 2: JSON nested too deeply") as refused:
        client.predict(space.llama, "uploaded file", 5, handle_file(str(upload)), "previous_token", 0, 0,
                       api_name="/corpus_heads")
    assert "Something went wrong" not in str(refused.value) and "RecursionError" not in str(refused.value)


# ---- the time cap ----

def test_the_corpus_time_cap_is_said_when_it_stops_a_job(space):
    model = space.services.models.get(space.llama)
    ids = [model.tokenizer(f"Text {i} is short.", return_tensors="pt")["input_ids"][0] for i in range(200)]
    updates = list(stream_over(model, "heads", Corpus(ids, "text", "200 short texts"), max_seconds=2.5,
                               clock=Ticking()))   # one batch holds them all; the cap is asked between its layers
    final = updates[-1]
    assert final.finished and final.result["previous_token"].n < 200
    assert "**Stopped at the time cap** of 2.5 s per job" in final.capped


def test_the_extrapolation_run_stops_at_the_corpus_jobs_cap(monkeypatch):
    first = extra.make_config(["none", "learned"], 10, 0, 100).kinds[0]   # the kind that trains first
    reads = Ticking()
    for _ in extra.run(extra.make_config([first], 10, 0, 100), interval=0.05, max_seconds=1e9, clock=reads):
        pass
    one_kind = reads.now + 1                                       # the clock's readings while one kind trains
    monkeypatch.setattr(extra, "run", functools.partial(extra.run, clock=Ticking()))
    services = SimpleNamespace(settings=AppSettings(corpus_max_seconds=one_kind + 2),
                               lab=SimpleNamespace(settings=LabSettings()))
    outputs = list(extrapolation_view(services, ["none", "learned"], 10, 0))
    status, note, _, _, numbers = outputs[-1]
    assert status.startswith(f"**Stopped at the time cap** of {one_kind + 2:g} s per job: the figures show the 1 "
                             "of 2 kinds finished by then"), status
    assert "1 of 2 kinds" in note and "the time cap stopped the rest" in note
    assert [kind["kind"] for kind in json.loads(json.dumps(numbers))["kinds"]] == [first]
