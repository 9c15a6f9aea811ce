"""The model work on Ray Serve: one deployment per model, the Gradio page a thin front (ui/backend/routing.py).

    python app.py --backend ray --ray-address auto --replicas 2 --num-cpus 2 --num-gpus 1
    python app.py --backend ray --ray-address ray://head:10001 --serve-config serve.yaml

Each replica builds the same page with its own services (never launched) and runs the event the front
names on the arguments the front sends; generators stream back through a streaming DeploymentHandle. A session's
calls carry its Gradio session hash as Serve's multiplexed model id, so Serve routes them to the replica that
served the session before, where its kept captures and generation rows live; when that replica is busy, gone or
has forgotten the session, the call runs elsewhere and the services treat the ticket as a cache miss.

A corpus job of the Across texts tab runs on the front instead (ui.backend.routing.route): the front reads and
encodes the corpus, splits it into chunks of items (core/corpus/chunks.py) and sends each chunk's token ids as a
call of the model's deployment (ModelReplica.corpus_chunk), so the chunks run on all its replicas at once, each
replica's weights loaded once; the front saves each chunk's items as it comes, merges the chunks' per-item values
and summarises once. A head's top examples and its query/key plane are one call each (ModelReplica.corpus_examples,
ModelReplica.corpus_qk) with every text's ids.

Imported only with `--backend ray`: `python app.py` never imports Ray (requirements-scale.txt installs it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import serve

from core.analysis.over import analysis_named
from core.corpus import chunks
from core.corpus import heads as head_places
from ui import memory
from ui.backend import routing as backend
from ui.page import build_page
from ui.services import Services
from ui.services.checks import UserError
from ui.services.models import OncePerName
from ui.settings import MAX_ATTENTION_TOKENS, AppSettings

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
MAX_DEPLOYED = 2  # models deployed at once, like the in-process ModelStore's capacity; the least recent goes
SESSIONS_PER_REPLICA = 500  # sessions a replica remembers for routing (like app.SESSIONS), least recent forgotten
REPLICA_ONGOING = 2  # requests a replica runs at once (the page's GENERATION_SLOTS); more wait in Serve's queue
APP_PREFIX = "attn-"
_DONE = object()


@serve.deployment(max_ongoing_requests=REPLICA_ONGOING)
class ModelReplica:
    """One model's page on one replica: runs the front's model events by key (ui.backend.model_events)."""

    def __init__(self, model_name: str, device: str | None, max_tokens: int):
        memory.configure()  # the front's allocator settings (connect passes them on), before the model loads
        self.model_name = model_name
        self.services = replica_services(model_name, device, max_tokens)
        self.events = backend.model_events(build_page(self.services, model_name))

    @serve.multiplexed(max_num_models_per_replica=SESSIONS_PER_REPLICA)
    async def session(self, session_id: str) -> str:
        return session_id  # nothing to load: remembering the id is what routes the session's calls here

    async def join_session(self) -> None:
        session_id = serve.get_multiplexed_model_id()
        if session_id:
            await self.session(session_id)

    async def call(self, key: str, args: tuple) -> Any:
        await self.join_session()
        return await asyncio.to_thread(backend.run_event, self.events, key, args)

    async def stream(self, key: str, args: tuple):
        await self.join_session()
        updates = backend.stream_event(self.events, key, args)
        while (update := await asyncio.to_thread(next, updates, _DONE)) is not _DONE:
            yield update

    async def corpus_chunk(self, analysis: str, items: list, arguments: dict) -> Any:
        """One chunk of a corpus job (core/corpus/chunks.py run_chunk) on this replica's model: its Measured over
        `items`, or a RemoteError with the words of its refusal."""
        return await self.stoppable(lambda stop: chunks.run_chunk(analysis_named(analysis), self.model(), items,
                                                                  stop=stop, **arguments))

    async def corpus_examples(self, texts: list, layer: int, head: int, k: int, per_decile: int) -> Any:
        """One head's top examples over the whole of `texts` (token ids the front read and encoded; core/corpus/
        heads.py top_examples), or a RemoteError with the words of its refusal."""
        return await self.stoppable(lambda stop: head_places.top_examples(self.model(), texts, layer, head, k,
                                                                          per_decile=per_decile, stop=stop))

    async def corpus_qk(self, texts: list, layer: int, head: int, max_points: int) -> Any:
        """One head's query/key plane over the whole of `texts` (token ids the front read and encoded; core/corpus/
        heads.py qk_over), or a RemoteError with the words of its refusal."""
        return await self.stoppable(lambda stop: head_places.qk_over(self.model(), texts, layer, head,
                                                                     max_points=max_points, stop=stop))

    def model(self):
        return self.services.models.get(self.model_name)

    @staticmethod
    async def stoppable(work) -> Any:
        """work(stop) in a thread; a front that cancels the call (its Stop) stops it at its next item."""
        cancelled = threading.Event()
        try:
            return await asyncio.to_thread(refused_in_words, work, cancelled.is_set)
        except asyncio.CancelledError:
            cancelled.set()
            raise


def refused_in_words(work, stop) -> Any:
    try:
        return work(stop)
    except ValueError as exc:
        return backend.RemoteError(str(exc))


@dataclass
class ServeOptions:
    """Serve deployment options for every model's deployment, and per model (a --serve-config YAML file:
    any keys of serve.deployment, e.g. num_replicas, ray_actor_options, max_ongoing_requests,
    autoscaling_config; `models: {name: {...}}` overrides them for one model; `corpus_chunk_items: N` sets how
    many items of a corpus job one call measures)."""

    common: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    chunk_items: int = chunks.CHUNK_ITEMS

    @classmethod
    def from_args(cls, replicas: int | None = None, num_cpus: float | None = None, num_gpus: float | None = None,
                  config_file: str | None = None) -> ServeOptions:
        options = cls()
        if config_file:
            options = cls.read(Path(config_file))
        actor = dict(options.common.get("ray_actor_options") or {})
        if num_cpus is not None:
            actor["num_cpus"] = num_cpus
        if num_gpus is not None:
            actor["num_gpus"] = num_gpus
        if actor:
            options.common["ray_actor_options"] = actor
        if replicas is not None:
            options.common["num_replicas"] = replicas
        return options

    @classmethod
    def read(cls, path: Path) -> ServeOptions:
        import yaml  # a dependency of ray

        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"--serve-config {path}: cannot be read as YAML ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"--serve-config {path}: expected a mapping of deployment options, got "
                             f"{type(raw).__name__}")
        models = raw.pop("models", None) or {}
        if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
            raise ValueError(f"--serve-config {path}: 'models' must map model names to deployment options")
        chunk_items = raw.pop("corpus_chunk_items", chunks.CHUNK_ITEMS)
        if isinstance(chunk_items, bool) or not isinstance(chunk_items, int) or chunk_items < 1:
            raise ValueError(f"--serve-config {path}: corpus_chunk_items is the number of items one call of a "
                             f"corpus job measures, a whole number ≥ 1, got {chunk_items!r}")
        return cls(raw, models, chunk_items)

    def for_model(self, name: str) -> dict:
        merged = {**self.common, **self.models.get(name, {})}
        if "ray_actor_options" in self.common and "ray_actor_options" in self.models.get(name, {}):
            merged["ray_actor_options"] = {**self.common["ray_actor_options"],
                                           **self.models[name]["ray_actor_options"]}
        return merged


def app_name(model_name: str) -> str:
    """A Serve application name for a model: readable, and unique for names that read alike (folders)."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(model_name).name or model_name).strip("-")[:40]
    return f"{APP_PREFIX}{readable}-{hashlib.sha1(model_name.encode()).hexdigest()[:8]}"


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` (or the one this process started) and start Serve without its HTTP
    proxy: the page reaches the replicas through handles only. The replicas import this repository: on a
    cluster it must sit at the same path on every node (or be in the nodes' image)."""
    if not ray.is_initialized():
        # a Ray started here listens on loopback only and has no dashboard, like the app's own defaults
        local = {} if address else {"_node_ip_address": "127.0.0.1", "include_dashboard": False}
        settings = {name: value for name, value in os.environ.items() if name.startswith("ATTN_MALLOC_")}
        ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **settings}},
                 log_to_driver=False, **local)
    serve.start(proxy_location="Disabled")


class RayBackend:
    """ui.backend's Backend on Ray Serve: one application with one deployment per model, deployed when the
    model is first asked for (the default model at start)."""

    front_concurrency_limit = None  # the front queues nothing itself: each replica runs REPLICA_ONGOING at once

    def __init__(self, options: ServeOptions, device: str | None = None,
                 max_tokens: int = MAX_ATTENTION_TOKENS):
        self.options, self.device, self.max_tokens = options, device, max_tokens
        # at most MAX_DEPLOYED: a retired model's replicas and their memory go; choosing it again deploys it again
        self._handles: OncePerName[serve.handle.DeploymentHandle] = OncePerName(
            MAX_DEPLOYED, on_drop=lambda name, _: self._delete(name))

    def deploy(self, model_name: str) -> serve.handle.DeploymentHandle:
        """The model's deployment, deployed now (and waited for) if it is not yet."""
        return self._handles.get(model_name, lambda: self._run(model_name))

    def _run(self, model_name: str) -> serve.handle.DeploymentHandle:
        options = self.options.for_model(model_name)
        log.info("deploying %s on Ray Serve as %s (%s)", model_name, app_name(model_name), options or "defaults")
        deployment = ModelReplica.options(name="model", **options)
        return serve.run(deployment.bind(model_name, self.device, self.max_tokens), name=app_name(model_name),
                         route_prefix=None)

    def _handle(self, model_name: str, session: str | None):
        handle = self.deploy(model_name)
        return handle.options(multiplexed_model_id=session) if session else handle

    def call(self, key: str, model_name: str, args: tuple, session: str | None = None) -> Any:
        return backend.received(self._handle(model_name, session).call.remote(key, args).result())

    def corpus_chunks(self, model_name: str) -> ServeChunks:
        """Where a corpus job on `model_name` runs its chunks: its deployment, as many at once as its replicas
        take (replicas × max_ongoing_requests), so every replica is kept busy and the rest wait on the front."""
        return ServeChunks(self.deploy(model_name), chunks_in_flight(self.options.for_model(model_name)),
                           self.options.chunk_items)

    def stream(self, key: str, model_name: str, args: tuple, session: str | None = None) -> Iterator:
        updates = self._handle(model_name, session).options(stream=True).stream.remote(key, args)
        try:
            for update in updates:
                yield backend.received(update)
        finally:
            updates.cancel()  # the page's Stop (or a closed tab) ends the generation on the replica too

    def close(self) -> None:
        """Delete the applications this front deployed."""
        for model_name, _ in self._handles.clear():
            self._delete(model_name)

    @staticmethod
    def _delete(model_name: str) -> None:
        try:
            serve.delete(app_name(model_name))
        except Exception as exc:  # noqa: BLE001 - a cluster already gone must not stop the app from closing
            log.warning("could not delete the Serve application of %s: %s", model_name, exc)


def chunks_in_flight(options: dict) -> int:
    """Chunks a front keeps under way on one model: its replicas (num_replicas, or an autoscaling deployment's
    max_replicas) × the requests each runs at once (max_ongoing_requests)."""
    replicas = options.get("num_replicas", 1)
    if not isinstance(replicas, int):     # "auto": the autoscaling config's ceiling
        replicas = (options.get("autoscaling_config") or {}).get("max_replicas", 1)
    return max(1, int(replicas)) * max(1, int(options.get("max_ongoing_requests", REPLICA_ONGOING)))


class ServeChunks:
    """A corpus job's calls of one model's deployment (ui.services.corpus.chunked runs them): each gives a Future
    of its result; cancelling it cancels the call."""

    def __init__(self, handle: serve.handle.DeploymentHandle, in_flight: int, chunk_items: int = chunks.CHUNK_ITEMS):
        self.handle, self.in_flight, self.chunk_items = handle, in_flight, chunk_items

    def submit(self, analysis: str, items: list, arguments: dict) -> Future:
        return self.watched(self.handle.corpus_chunk.remote(analysis, items, arguments))

    def examples(self, texts: list, layer: int, head: int, k: int, per_decile: int) -> Future:
        return self.watched(self.handle.corpus_examples.remote(texts, layer, head, k, per_decile))

    def qk(self, texts: list, layer: int, head: int, max_points: int) -> Future:
        return self.watched(self.handle.corpus_qk.remote(texts, layer, head, max_points))

    def watched(self, response) -> Future:
        future: Future = Future()
        future.add_done_callback(lambda done: response.cancel() if done.cancelled() else None)
        threading.Thread(target=self._wait, args=(response, future), name="corpus-chunk", daemon=True).start()
        return future

    @staticmethod
    def _wait(response, future: Future) -> None:
        try:
            value = response.result()
            outcome = ValueError(value.message) if isinstance(value, backend.RemoteError) else value
        except Exception as exc:  # noqa: BLE001 - handed to the front, which names the chunk's items
            outcome = exc
        try:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        except InvalidStateError:
            pass      # cancelled by the front meanwhile: nobody reads it


def replica_services(model_name: str, device: str | None = None, max_tokens: int = MAX_ATTENTION_TOKENS
                     ) -> Services:
    settings = AppSettings.from_env(device=device, max_attention_tokens=max_tokens)
    return Services.create(settings, default_model=model_name)


def replica_page(model_name: str, device: str | None = None, max_tokens: int = MAX_ATTENTION_TOKENS
                 ) -> dict[str, backend.ModelEvent]:
    """What a replica runs: the same page as the front's, built here with its own services and never launched,
    so its model events are the front's functions working on real weights."""
    return backend.model_events(build_page(replica_services(model_name, device, max_tokens), model_name))


def start(model_name: str, address: str | None, options: ServeOptions, device: str | None,
          max_tokens: int) -> RayBackend:
    """The Ray Serve backend, connected and with the default model deployed (its replicas load it before the page
    opens); a cluster that cannot be reached or deployed to is a UserError that says which."""
    backend_ = None
    try:
        connect(address)
        backend_ = RayBackend(options, device=device, max_tokens=max_tokens)
        backend_.deploy(model_name)
    except Exception as exc:  # noqa: BLE001 - a cluster that cannot be reached or deployed to is the user's to fix
        if backend_ is not None:
            backend_.close()
        where = address or "a local Ray instance"
        raise UserError(f"Ray Serve on {where} could not serve {model_name}: {type(exc).__name__}: "
                        f"{str(exc)[:300]}") from None
    return backend_
