"""The training lab's service: background training jobs, each session's runs, attention views and saving a run
into the weight store. Plain Python over core.lab.train; it never imports gradio and never draws.

A job trains one run, or two interleaved step by step (a comparison), in its own thread, and stops when asked
(train(stop=...)), after its step budget, or after the server's time budget. Jobs are capped server-wide and
to one per session; a session's runs live here, keyed by the session id, until it has been idle for an hour.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

import core.store as weight_store
from core.lab import train as engine
from core.lab.answers import alignment_note, answer_of, expected_answer
from core.lab.train import LabConfig
from ui.plots.lab import Curve
from ui.services.checks import UserError
from ui.services.lab.configs import (EXPERIMENTS, MAX_DECODER_SOURCE, MAX_RUNS_PER_SESSION, NAME, POLL_S,
                                     SESSION_IDLE_S, Summary, _finite, _num, _pct, describe, experiment_pair, finding)
from ui.services.lab import saved as shipped
from ui.services.lab.private import PrivateRuns
from ui.services.lab.residual import first_update_shares
from ui.settings import LabSettings

log = logging.getLogger(__name__)


@dataclass
class RunRecord:
    id: str
    label: str
    lab: LabConfig
    run: engine.Run | None = None  # set by the job at its first step
    status: str = "training"  # training | done | stopped | time budget | failed: …

    @property
    def finished(self) -> bool:
        return self.status != "training"

    def history(self) -> list[engine.Progress]:
        return list(self.run.history) if self.run is not None else []  # a copy: the job appends

    def summary(self) -> Summary:
        history = self.history()
        losses = [p.train_loss for p in history]
        final = self.run.final if self.run is not None else None
        entropy = self.run.initial_entropy if self.run is not None else []
        n_early = max(1, len(losses) // 10)
        last = history[-1] if history else None
        return Summary(
            steps=last.step if last else 0,
            train_loss=float(np.mean(losses[-10:])) if losses else math.nan,
            early_loss=float(np.mean(losses[:n_early])) if losses else math.nan,
            held_loss=final.held_loss if final else None, exact_match=final.exact_match if final else None,
            initial_entropy=float(np.mean(entropy)) if entropy else None, uniform_entropy=self.uniform_entropy,
            tokens_per_s=last.tokens_per_s if last else 0.0, seconds=last.seconds if last else 0.0,
            stopped_early=bool(last and last.step < self.lab.steps))

    @functools.cached_property
    def uniform_entropy(self) -> float:
        """Mean log(number of visible keys) over the held-out rows the engine measures entropy on: what the
        entropy at initialisation would be if attention were uniform."""
        config = self.lab
        held = engine.examples(config.task, config.seed, config.eval_examples, True, config.lengths)
        if config.family == "marian":  # rows of <bos> target; without the mask every padded column is visible
            width = max(len(t) for _, t in held) + 1
            sizes = [(i + 1) if config.causal_mask else width for _, t in held for i in range(len(t) + 1)]
        else:
            sizes = [(i + 1) if config.causal_mask else len(s) + len(t) + 3
                     for s, t in held for i in range(len(s) + len(t) + 3)]
        return float(np.mean(np.log(sizes)))

    def row(self) -> list:
        s = self.summary()
        status = f"training (step {s.steps})" if self.status == "training" else self.status
        return [self.id, self.label, self.lab.task, describe(self.lab), s.steps, status, _num(s.train_loss, 4),
                _num(s.held_loss, 4), _pct(s.exact_match), _num(s.initial_entropy, 3), round(s.tokens_per_s),
                round(s.seconds, 1)]

    def curve(self) -> Curve:
        history = self.history()
        evals = [p for p in history if p.exact_match is not None]
        return Curve(name=f"{self.id} {self.label}", steps=np.array([p.step for p in history]),
                     train_loss=np.array([p.train_loss for p in history], dtype=np.float64),
                     eval_steps=np.array([p.step for p in evals]),
                     held_loss=np.array([p.held_loss for p in evals], dtype=np.float64),
                     exact_match=np.array([p.exact_match for p in evals], dtype=np.float64))

    def latest(self) -> dict:
        """The numbers an API client streams: the last step's, and the last evaluation's."""
        history = self.history()
        last = history[-1] if history else None
        final = self.run.final if self.run is not None else None
        return dict(run=self.id, label=self.label, status=self.status, step=last.step if last else 0,
                    steps=self.lab.steps, train_loss=_finite(last.train_loss) if last else None,
                    held_loss=_finite(final.held_loss) if final else None,
                    exact_match=final.exact_match if final else None,
                    eval_step=final.step if final else None, tokens_per_s=last.tokens_per_s if last else 0.0,
                    seconds=last.seconds if last else 0.0)

    def status_line(self) -> str:
        history = self.history()
        last = history[-1] if history else None
        final = self.run.final if self.run is not None else None
        state = {"time budget": "stopped by the time budget"}.get(self.status, self.status)
        line = f"**{self.id}** {self.label}: {state}, step {last.step if last else 0} / {self.lab.steps}"
        if last is not None:
            line += f", training loss {_num(last.train_loss, 3)}"
        if final is not None:
            line += (f", held-out loss {_num(final.held_loss, 3)} and exact match {_pct(final.exact_match)} "
                     f"(step {final.step})")
        return line + (f", {last.tokens_per_s:,.0f} tokens/s, {last.seconds:.1f} s" if last else "")


class Job:
    """One or two runs trained in a background thread, interleaved step by step so their curves grow together."""

    def __init__(self, session: str, records: list[RunRecord], experiment: str | None = None, note: str = ""):
        self.session, self.records, self.experiment, self.note = session, records, experiment, note
        self.finding = ""
        self.stop_requested = threading.Event()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return not self.done.is_set()

    def stop(self) -> None:
        self.stop_requested.set()

    def steps_done(self) -> int:
        return sum(len(r.run.history) for r in self.records if r.run is not None)

    def run(self, release: Callable[[Job], None]) -> None:
        iterators = [engine.train(r.lab, stop=self.stop_requested.is_set) for r in self.records]
        active = list(range(len(iterators)))
        try:
            while active:
                for i in list(active):
                    try:
                        self.records[i].run, _ = next(iterators[i])
                    except StopIteration:
                        active.remove(i)
            for r in self.records:
                stopped = r.run is None or r.run.stopped
                r.status = ("stopped" if self.stop_requested.is_set() else "time budget") if stopped else "done"
            if self.experiment and all(r.run is not None for r in self.records):
                a, b = self.records
                # the Marian layout's Pre-LN/Post-LN pair: why, measured on the fresh model its config builds
                shares = (first_update_shares(a.lab) if self.experiment == "norm" and a.lab.family == "marian"
                          else None)
                self.finding = finding(self.experiment, a.summary(), b.summary(), a.lab, shares)
        except Exception as exc:  # noqa: BLE001 - the page shows the failure; the server log has the traceback
            log.exception("lab job %s failed", [r.id for r in self.records])
            for r in self.records:
                r.status = f"failed: {type(exc).__name__}: {exc}"
        finally:
            release(self)
            self.done.set()

    def run_ids(self) -> str:
        return ", ".join(r.id for r in self.records)


@dataclass
class LabSession:
    key: str
    runs: OrderedDict[str, RunRecord] = field(default_factory=OrderedDict)
    findings: list[str] = field(default_factory=list)  # one per finished comparison, newest last
    job: Job | None = None
    count: int = 0
    last_used: float = field(default_factory=time.monotonic)

    def new_id(self) -> str:
        self.count += 1
        return f"run{self.count}"

    def add(self, record: RunRecord) -> None:
        self.runs[record.id] = record
        finished = [k for k, r in self.runs.items() if r.finished]
        while len(self.runs) > MAX_RUNS_PER_SESSION and finished:
            self.runs.pop(finished.pop(0))


@dataclass
class AttentionView:
    """A trained run's attention on one source: layers × heads × queries × keys, float32 numpy."""

    source_tokens: list[str]
    target_tokens: list[str]
    decoder: np.ndarray
    encoder: np.ndarray | None
    cross: np.ndarray | None
    note: str


@dataclass
class SnapshotView:
    """The attention kept at chosen steps, on the first held-out example: [steps, layers, queries, keys], the mean
    of the heads; cross-attention for an encoder-decoder, self-attention for a decoder."""

    steps: list[int]
    maps: np.ndarray
    query_tokens: list[str]
    key_tokens: list[str]
    kind: str


class Lab:
    """Jobs and runs of every session, behind one lock; one object per server."""

    def __init__(self, settings: LabSettings | None = None, weights_root: Path | None = None):
        self.settings = settings or LabSettings()
        self._weights_root = weights_root
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._sessions: dict[str, LabSession] = {}
        self._jobs: set[Job] = set()
        # on a shared server saved runs are this session's alone (ui/services/lab/private.py)
        self.private = PrivateRuns(self.weights_root(), self.settings.private_ttl_s) if self.settings.private else None

    # -- sessions and jobs

    def session(self, key: str | None) -> LabSession:
        key = key or "anonymous"
        now = time.monotonic()
        with self._lock:
            for old in [k for k, s in self._sessions.items()
                        if now - s.last_used > SESSION_IDLE_S and (s.job is None or not s.job.alive)]:
                del self._sessions[old]
            session = self._sessions.setdefault(key, LabSession(key))
            session.last_used = now
            return session

    def active_jobs(self) -> int:
        with self._lock:
            return len(self._jobs)

    def train(self, key: str | None, config: LabConfig) -> Job:
        return self._start(key, [("", config)], None, "")

    def compare(self, key: str | None, config: LabConfig, experiment: str) -> Job:
        a, b, note = experiment_pair(config, experiment)
        names = EXPERIMENTS[experiment].names
        return self._start(key, [(names[0], a), (names[1], b)], experiment, note)

    def capped(self, config: LabConfig) -> LabConfig:
        """The config under this server's caps: steps past ATTN_LAB_MAX_STEPS refused in words, and a time budget of
        at most ATTN_LAB_MAX_SECONDS whatever the config asked (a preset's None included)."""
        if config.steps > self.settings.max_steps:
            raise UserError(f"Steps must be at most {self.settings.max_steps} on this server, got {config.steps}.")
        budget = min(config.time_budget or math.inf, self.settings.max_seconds)
        return config if budget == config.time_budget else replace(config, time_budget=budget)

    def _start(self, key, configs: list[tuple[str, LabConfig]], experiment: str | None, note: str) -> Job:
        configs = [(label, self.capped(config)) for label, config in configs]
        session = self.session(key)
        with self._lock:
            if session.job is not None and session.job.alive:
                raise UserError(f"This session is already training ({session.job.run_ids()}); stop it or wait for "
                                "it to finish. Each session trains one job at a time.")
            if len(self._jobs) >= self.settings.max_jobs:
                raise UserError(f"The server is already training {len(self._jobs)} jobs, its limit "
                                f"(ATTN_LAB_JOBS={self.settings.max_jobs}); try again when one has finished.")
            records = []
            for label, config in configs:
                record = RunRecord(session.new_id(), label or f"{config.task}, {config.family}", config)
                records.append(record)
            job = Job(session.key, records, experiment, note)
            self._jobs.add(job)
            session.job = job
            for record in records:
                session.add(record)
        job.thread = threading.Thread(target=job.run, args=(self._release,), name=f"lab-{job.run_ids()}",
                                      daemon=True)
        job.thread.start()
        return job

    def _release(self, job: Job) -> None:
        with self._lock:
            self._jobs.discard(job)
            if job.finding:
                session = self._sessions.get(job.session)
                if session is not None:
                    session.findings.append(job.finding)

    def stop(self, key: str | None, wait: float = 0.0) -> Job | None:
        """Ask the session's job to stop (it ends before its next step and evaluates what it has); wait up to
        `wait` seconds for it. Returns the job, or None when the session never trained."""
        job = self.session(key).job
        if job is not None:
            job.stop()
            job.done.wait(wait)
        return job

    def last_job(self, key: str | None) -> Job | None:
        return self.session(key).job

    @staticmethod
    def follow(job: Job, interval: float = POLL_S) -> Iterator[Job]:
        """Yields the job at once, then whenever it has made new steps (at most every `interval` s), and once
        more when it has finished."""
        yield job
        seen = job.steps_done()
        while not job.done.wait(interval):
            if job.steps_done() != seen:
                seen = job.steps_done()
                yield job
        yield job

    # -- what a job shows

    @staticmethod
    def status(job: Job) -> str:
        lines = [r.status_line() for r in job.records]
        if job.note:
            lines.insert(0, f"Compared on: {job.note}.")
        if job.finding:
            lines.append(job.finding)
        return "  \n".join(lines)

    @staticmethod
    def curves(job: Job) -> list[Curve]:
        return [r.curve() for r in job.records]

    @staticmethod
    def latest(job: Job) -> dict:
        return dict(done=not job.alive, runs=[r.latest() for r in job.records], finding=job.finding or None)

    @staticmethod
    def snapshots(record: RunRecord) -> SnapshotView | None:
        if record.run is None or not record.run.snapshots:
            return None
        kept = sorted(record.run.snapshots.items())  # the engine adds entries as it trains: take them at once
        first = kept[0][1]
        kind = "cross-attention" if first.cross is not None else "decoder self-attention"
        maps = np.stack([(m.cross if m.cross is not None else m.decoder).mean(1).numpy() for _, m in kept])
        return SnapshotView([s for s, _ in kept], maps.astype(np.float32), first.target_tokens,
                            first.source_tokens, kind)

    # -- finished runs

    def runs(self, key: str | None) -> list[RunRecord]:
        session = self.session(key)
        with self._lock:  # a job of this session may be adding runs
            return list(session.runs.values())

    def table(self, key: str | None) -> list[list]:
        return [r.row() for r in self.runs(key)]

    def findings(self, key: str | None) -> list[str]:
        session = self.session(key)
        with self._lock:
            return list(session.findings)

    def finished_run(self, key: str | None, run_id) -> RunRecord:
        run_id = str(run_id or "").strip()
        if not run_id:
            raise UserError("Choose a run first: train one, then pick it by its id (run1, run2, …).")
        runs = {r.id: r for r in self.runs(key)}
        record = runs.get(run_id)
        if record is None:
            known = ", ".join(runs) or "none yet"
            raise UserError(f"This session has no run {run_id!r} (its runs: {known}).")
        if not record.finished:
            raise UserError(f"{run_id} is still training; wait for it to finish or stop it.")
        if record.run is None or record.status.startswith("failed"):
            raise UserError(f"{run_id} has no trained model ({record.status}).")
        return record

    def trained(self, key: str | None, run_id) -> tuple[str, LabConfig, object]:
        """(id, config, model) of a finished run of this session, or of a run the project ships
        (ui/services/lab/saved.py: its id names it in every session)."""
        if shipped.is_saved(run_id):
            run = shipped.load(run_id.strip())
            return run.id, run.lab, run.model
        record = self.finished_run(key, run_id)
        return record.id, record.lab, record.run.model

    def run_ids(self, key: str | None) -> list[str]:
        """What the attention section can open: the runs the project ships, then this session's finished runs."""
        return [*shipped.SAVED_RUNS, *(r.id for r in self.runs(key) if r.finished and r.run is not None)]

    def attention(self, key: str | None, run_id, text) -> AttentionView:
        run_name, lab, model = self.trained(key, run_id)
        source = str(text or "").strip()
        if lab.family == "llama" and len(source) > MAX_DECODER_SOURCE:
            raise UserError(f"A decoder-only lab model reads <bos> source <sep> answer <eos> in at most "
                            f"{lab.max_len} positions, so its sources have at most {MAX_DECODER_SOURCE} "
                            f"characters; this one has {len(source)}.")
        try:
            maps = engine.lab_attention(model, lab.family, source)
        except ValueError as exc:
            raise UserError(f"Source: {exc}.") from None
        as_np = lambda t: None if t is None else t.float().numpy()  # noqa: E731
        answer = "".join(maps.target_tokens[1:]) if maps.cross is not None else answer_of(maps, source)
        notes = [f"**{run_name}** ({lab.task}) answers **{answer or '(nothing)'}**"]
        expected = expected_answer(lab.task, source)
        if expected is not None:
            notes[0] += " (right)." if answer == expected else f"; the task's answer is **{expected}**."
        aligned = alignment_note(lab.task, source, maps)
        if aligned:
            notes.append(aligned)
        return AttentionView(maps.source_tokens, maps.target_tokens, as_np(maps.decoder), as_np(maps.encoder),
                             as_np(maps.cross), "  \n".join(notes))

    # -- keeping a run

    def weights_root(self) -> Path:
        return self._weights_root or weight_store.WeightStore.default().root

    def save(self, key: str | None, run_id, name, progress: Callable[[float, str], None] | None = None) -> Path:
        """The run as weights/NAME with the store's manifest (source: trained here, task, seed, lab config);
        never over an existing folder or a registry name. On a shared server (self.private) it goes to this
        session's private folder instead, and only this session's picker lists it (picker_name)."""
        record = self.finished_run(key, run_id)
        name = str(name or "").strip()
        if not NAME.match(name):
            raise UserError(f"A model name takes 1 to 64 letters, digits, '-' and '_', got {name!r}.")
        if name in weight_store.load_registry():
            raise UserError(f"{name!r} is a model of the weight store's registry; choose another name.")
        root = self.weights_root()
        private = self.private is not None
        target = self.private.folder(str(key), name) if private else root / name
        with self._save_lock:
            if private and self.private.taken(str(key), name):
                raise UserError(f"This page already saved a run named {name!r}; choose another name.")
            if target.exists():
                raise UserError(f"A model named {name!r} already exists (weights/{name}); choose another name.")
            target.parent.mkdir(parents=True, exist_ok=True)
            # written in a hidden folder and renamed into place, so a half-written model never shows in the picker
            staging = root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                if progress:
                    progress(0.1, f"writing {name}")
                engine.save(record.run, staging / name)
                if progress:
                    progress(0.9, "moving it into the weight store")
                os.rename(staging / name, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            if private:
                self.private.add(str(key), name, target)
        if progress:
            progress(1.0, f"saved {name}")
        return target

    def picker_name(self, key: str | None, folder: Path) -> str:
        """What the model picker calls a saved run: its name, or on a shared server its session's alias."""
        if self.private is None:
            return folder.name
        return next(alias for alias in self.private.choices(str(key)) if self.private.resolve(alias) == folder)

    def private_choices(self, key: str | None) -> list[str]:
        """The saved runs only this session's picker lists (none on a laptop, where runs are everyone's)."""
        return [] if self.private is None else self.private.choices(str(key))

    def private_folder(self, name: str) -> Path | None:
        """The folder of a private run's alias, for the model store; None for any other name."""
        if self.private is None:
            return None
        folder = self.private.resolve(name)
        if folder is None and name in self.private.gone:
            raise UserError(f"{name!r} was a run saved on this page; runs saved on a shared server are deleted "
                            f"{duration(self.private.ttl_s)} after saving, and this one has been. Train and save it "
                            "again.")
        return folder


def duration(seconds: float) -> str:
    """'60 minutes', or '2 seconds' for a lifetime under a minute."""
    return f"{seconds / 60:g} minutes" if seconds >= 60 else f"{seconds:g} second{'' if seconds == 1 else 's'}"
