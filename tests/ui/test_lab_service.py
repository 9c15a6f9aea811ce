"""The Lab tab's service (ui/services/lab) and plots (ui/plots/lab.py) without Gradio: tiny runs train and stream their
curves, the job cap and the one-job-per-session rule refuse with a message, Stop ends the thread, bad configs and
sources are named, comparisons differ in one switch and their sentences come from the numbers, saved runs join
the weight store."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from core import load_model
from core.store import WeightStore, load_registry
from ui.plots import lab as lab_plots
from ui.services.checks import UserError
from ui.services.lab.configs import Summary, experiment_pair, finding, make_config
from ui.services.lab.runs import Lab
from ui.settings import LabSettings

SETTINGS = LabSettings(max_jobs=2, max_steps=5000, max_seconds=60, eval_examples=16)
TINY = dict(task="reverse", family="marian", n_layers=1, d_model=32, n_heads=2, d_ff=64, dropout=0.0,
            positions="default", norm="default", causal_mask=True, scale=True, seed=0, steps=20, lr=3e-3,
            snapshot_steps="10, 20")


def config(**kw):
    return make_config(SETTINGS, **{**TINY, **kw})


def finish(lab: Lab, job, timeout: float = 60.0):
    updates = list(lab.follow(job, interval=0.05))
    assert job.done.wait(timeout)
    return updates


@pytest.fixture(scope="module")
def trained():
    """One tiny finished run, shared by the tests that only read it."""
    lab = Lab(SETTINGS)
    job = lab.train("s", config())
    updates = finish(lab, job)
    return lab, job, updates


def test_a_tiny_run_trains_and_streams_its_curve(trained):
    lab, job, updates = trained
    record = job.records[0]
    assert record.id == "run1" and record.status == "done" and len(updates) >= 2
    assert lab.latest(updates[0])["runs"][0]["run"] == "run1"
    curve = record.curve()
    assert curve.steps.tolist() == list(range(1, 21))
    assert curve.eval_steps.tolist() == [5, 10, 15, 20]  # every tenth of the run, at least every 5 steps
    assert np.isfinite(curve.train_loss).all() and curve.train_loss[-5:].mean() < curve.train_loss[:5].mean()
    latest = lab.latest(job)
    assert latest["done"] and latest["runs"][0]["step"] == 20 and latest["runs"][0]["tokens_per_s"] > 0
    assert 0 <= latest["runs"][0]["exact_match"] <= 1
    assert "**run1**" in lab.status(job) and "done, step 20 / 20" in lab.status(job)
    row = lab.table("s")[0]
    assert row[0] == "run1" and row[4] == 20 and row[5] == "done" and "marian 1×32" in row[3]
    fig = lab_plots.training_curves(lab.curves(job), "t", 20)
    assert [t.name for t in fig.data] == ["run1 reverse, marian: training", "run1 reverse, marian: held-out",
                                          "run1 reverse, marian: exact match"]


def test_snapshots_and_the_attention_of_a_trained_run(trained):
    lab, job, _ = trained
    snap = lab.snapshots(job.records[0])
    assert snap.steps == [10, 20] and snap.kind == "cross-attention"
    assert snap.maps.shape == (2, 1, len(snap.query_tokens), len(snap.key_tokens))
    np.testing.assert_allclose(snap.maps.sum(-1), 1.0, atol=1e-5)
    view = lab.attention("s", "run1", "abcdefgh")
    assert view.source_tokens == list("abcdefgh") + ["<eos>"] and view.target_tokens[0] == "<bos>"
    assert view.encoder.shape == (1, 2, 9, 9) and view.cross.shape[:3] == (1, 2, len(view.target_tokens))
    assert "**run1** (reverse) answers" in view.note and "(the anti-diagonal): layer 0: " in view.note
    fig = lab_plots.heatmap_grid(view.cross, ["layer 0"], ["head 0", "head 1"], view.target_tokens,
                                 view.source_tokens, "cross")
    assert len(fig.data) == 2 and fig.data[0].x[0] == "0 a" and fig.data[0].y[0] == "0 <bos>"
    for bad, message in (("abc!", "outside the lab's vocabulary"), ("", "1 to 40 characters")):
        with pytest.raises(UserError, match=message):
            lab.attention("s", "run1", bad)
    with pytest.raises(UserError, match="no run 'run9'"):
        lab.attention("s", "run9", "abc")
    with pytest.raises(UserError, match="no run 'run1'"):
        lab.attention("another session", "run1", "abc")


def test_a_shipped_run_opens_in_every_session_as_a_run_trained_there():
    """The course's reversing encoder-decoder is in every session's Run list, first, and its attention is read as a
    trained run's: the config from its manifest, its own greedy answer, the anti-diagonal it learned."""
    from ui.services.lab import saved as shipped

    lab = Lab(LabSettings())
    assert lab.run_ids("anyone") == [shipped.REVERSE, shipped.INDUCTION]
    run = shipped.load(shipped.REVERSE)
    assert (run.lab.task, run.lab.family, run.lab.d_model, run.lab.steps) == ("reverse", "marian", 32, 800)
    view = lab.attention("anyone", shipped.REVERSE, "mirrortarget")
    assert f"**{shipped.REVERSE}** (reverse) answers **tegratrorrim** (right)." in view.note
    assert view.cross.shape[:2] == (2, 2) and view.encoder.shape == (2, 2, 13, 13)
    n = len("mirrortarget")
    rows = view.cross[-1].mean(0)[:n]                       # last layer, mean of heads: output i over the source
    assert float(np.mean([rows[i, n - 1 - i] for i in range(n)])) > 0.5
    with pytest.raises(UserError, match="no saved run"):
        shipped.load("saved: nothing")


def test_the_job_cap_and_one_job_per_session_refuse_with_a_message():
    lab = Lab(SETTINGS)
    long = config(steps=4000, snapshot_steps="")
    first, second = lab.train("a", long), lab.train("b", long)
    try:
        assert lab.active_jobs() == 2
        with pytest.raises(UserError, match=r"already training 2 jobs, its limit \(ATTN_LAB_JOBS=2\)"):
            lab.train("c", long)
        with pytest.raises(UserError, match=r"This session is already training \(run1\)"):
            lab.compare("a", long, "positions")
    finally:
        for key in ("a", "b"):
            lab.stop(key, wait=30)
    assert not first.alive and not second.alive and lab.active_jobs() == 0
    third = lab.train("c", long)  # a freed slot is usable again
    lab.stop("c", wait=30)
    assert third.records[0].status == "stopped"


def test_stop_ends_the_job_and_its_thread():
    lab = Lab(SETTINGS)
    job = lab.train("s", config(steps=4000, snapshot_steps=""))
    deadline = time.monotonic() + 30
    while job.steps_done() < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    lab.stop("s", wait=30)
    job.thread.join(5)
    assert not job.thread.is_alive() and not job.alive
    record = job.records[0]
    assert record.status == "stopped" and 3 <= record.summary().steps < 4000
    assert record.run.final is not None, "a stopped run is evaluated on what it learned"
    assert "stopped, step" in lab.status(job)


def test_the_time_budget_stops_a_run():
    lab = Lab(LabSettings(max_seconds=0.3, eval_examples=8))
    job = lab.train("s", make_config(lab.settings, **{**TINY, "steps": 3000, "snapshot_steps": ""}))
    finish(lab, job)
    assert job.records[0].status == "time budget" and job.records[0].summary().steps < 3000
    assert "stopped by the time budget" in lab.status(job)


@pytest.mark.parametrize("bad,message", [
    (dict(n_heads=3), r"D_model \(32\) must be a multiple of n_heads \(3\)"),
    (dict(d_ff=0), "d_ff must be between 1 and 1024, got 0"),
    (dict(task="poetry"), "Unknown task 'poetry'; the tasks are copy, copy-62, reverse, sort, add, dates"),
    (dict(family="gpt"), "Family must be 'marian'"),
    (dict(d_model=512), "d_model must be between 32 and 256"),
    (dict(steps=6000), "Steps must be between 1 and 5000"),
    (dict(lr="fast"), "lr must be a number"),
    (dict(snapshot_steps="10, 30"), r"between 1 and 20 \(the run's length\), got 30"),
    (dict(positions="rope", d_model=36, n_heads=4), "even head size"),
])
def test_bad_configs_are_named(bad, message):
    with pytest.raises(UserError, match=message):
        config(**bad)


def test_a_comparison_differs_in_one_switch_and_trains_both():
    base = config(steps=10, snapshot_steps="")
    a, b, note = experiment_pair(base, "causal_mask")
    assert a.family == b.family == "llama" and "decoder only" in note
    assert (a.causal_mask, b.causal_mask) == (True, False) and {**vars(a), "causal_mask": False} == vars(b)
    a, b, note = experiment_pair(base, "scale")
    assert a.n_heads == 1 and "d_k = d_model = 32" in note and (a.scale, b.scale) == (True, False)
    a, b, note = experiment_pair(base, "norm")
    assert a.lr == b.lr == 3e-3 and (a.norm, b.norm) == ("pre", "post")
    a, b, _ = experiment_pair(config(positions="none"), "positions")
    assert (a.positions, b.positions) == (None, "none")
    with pytest.raises(UserError, match="Unknown comparison"):
        experiment_pair(base, "gravity")
    lab = Lab(SETTINGS)
    job = lab.compare("s", base, "causal_mask")
    finish(lab, job)
    assert [r.id for r in job.records] == ["run1", "run2"] and [r.status for r in job.records] == ["done"] * 2
    assert job.finding.startswith("Without the causal mask the training loss fell to")
    assert lab.findings("s") == [job.finding] and len(lab.table("s")) == 2
    view = lab.attention("s", "run2", "abcd")  # a decoder only: one sequence, no encoder, no cross-attention
    assert view.cross is None and view.encoder is None and view.source_tokens[:6] == ["<bos>", *"abcd", "<sep>"]
    assert view.decoder.shape[-1] == len(view.source_tokens)
    with pytest.raises(UserError, match="at most 20 characters; this one has 21"):
        lab.attention("s", "run2", "a" * 21)


def summary(**kw):
    base = dict(steps=100, train_loss=1.0, early_loss=3.0, held_loss=1.0, exact_match=0.5, initial_entropy=2.0,
                uniform_entropy=2.3, tokens_per_s=1000.0, seconds=1.0, stopped_early=False)
    return Summary(**{**base, **kw})


def test_the_sentences_come_from_the_measured_numbers():
    cfg = config()
    leaky = finding("causal_mask", summary(train_loss=0.66, exact_match=0.25), summary(train_loss=0.01, exact_match=0),
                    cfg)
    caveat = f" One seed ({cfg.seed}) on one task ({cfg.task}): another seed or task can come out otherwise."
    assert leaky == ("Without the causal mask the training loss fell to 0.01 (masked: 0.66) but free-running exact "
                     "match is 0 % (masked: 25 %): the decoder learned to read the answer it is asked to predict."
                     + caveat)
    # numbers that do not show the leak get no conclusion
    plain = finding("causal_mask", summary(train_loss=0.5, exact_match=0.2), summary(train_loss=0.6, exact_match=0.3),
                    cfg)
    assert plain.endswith("(masked: 20 %)." + caveat) and "learned to read" not in plain
    scale = finding("scale", summary(initial_entropy=2.2), summary(initial_entropy=1.1, early_loss=3.5), cfg)
    assert "entropy at initialisation is 1.10 nats without 1/√d_k (with: 2.20; uniform: 2.30)" in scale
    assert "3.50 (with: 3.00)" in scale and "starts peakier" in scale
    assert "peakier" not in finding("scale", summary(initial_entropy=1.0), summary(initial_entropy=1.5), cfg)
    norm = finding("norm", summary(train_loss=0.1), summary(train_loss=float("nan"), steps=40, stopped_early=True),
                   cfg)
    assert "Post-LN ended with training loss NaN" in norm and "clearly worse" in norm and "stopped at step 40" in norm
    positions = finding("positions", summary(exact_match=0.9), summary(exact_match=0.05), cfg)
    assert "could not do the task" in positions
    # Pre-LN worse on the Marian layout: the reason, measured on the fresh model, where the result is shown
    marian = config(norm="pre")
    shares = {"with": 1.234, "without": 56.78, "d_model": 32}
    worse = finding("norm", summary(train_loss=2.0, exact_match=0.0), summary(train_loss=0.2, exact_match=0.92),
                    marian, shares)
    assert "Here Pre-LN trained clearly worse. Why" in worse and "1.2 % of the residual" in worse
    assert "56.8 % without that scale" in worse and "(d = 32)" in worse and worse.endswith("come out otherwise.")
    assert "Why" not in finding("norm", summary(train_loss=2.0), summary(train_loss=0.2), marian)   # none measured


def test_the_first_update_share_is_measured_on_the_fresh_model_its_config_builds():
    from ui.services.lab.residual import first_update_shares

    pre = config(norm="pre")
    shares = first_update_shares(pre)
    assert shares == first_update_shares(pre)                    # seeded: the same model every time
    assert 0 < shares["with"] < shares["without"] and shares["d_model"] == 32


def test_a_saved_run_joins_the_weight_store_and_is_never_overwritten(trained, tmp_path):
    lab, _, _ = trained
    saver = Lab(SETTINGS, weights_root=tmp_path)
    saver._sessions = lab._sessions  # the same session's runs, another weights folder
    seen = []
    folder = saver.save("s", "run1", "my-reverse_1", lambda f, m: seen.append(f))
    assert folder == tmp_path / "my-reverse_1" and seen[-1] == 1.0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["name"] == "my-reverse_1" and manifest["source"]["type"] == "trained"
    assert manifest["source"]["task"] == "reverse" and manifest["source"]["seed"] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    store = WeightStore(root=tmp_path, registry=load_registry())
    assert "my-reverse_1" in store.known_names() and store.ensure("my-reverse_1") == folder
    model = load_model(folder, device="cpu")
    assert model.config.is_encoder_decoder and model.tokenizer is not None
    for run_id, name, message in (("run1", "my-reverse_1", "already exists"), ("run1", "../x", "letters, digits"),
                                  ("run1", "", "letters, digits"), ("run1", "gpt2", "registry"),
                                  ("run7", "fine", "no run 'run7'")):
        with pytest.raises(UserError, match=message):
            saver.save("s", run_id, name)


def test_on_a_shared_server_a_saved_run_is_its_sessions_alone_and_expires(trained, tmp_path):
    from dataclasses import replace

    from ui.services.models import ModelStore

    lab, _, _ = trained
    saver = Lab(replace(SETTINGS, private=True, private_ttl_s=3600), weights_root=tmp_path)
    saver._sessions = lab._sessions  # session "s" has run1
    store = ModelStore()
    store.private = saver.private_folder
    folder = saver.save("s", "run1", "mine")
    assert folder.parent.parent == tmp_path / ".private" and folder.name == "mine"
    alias = saver.picker_name("s", folder)
    assert alias.startswith("mine (this page's run, ") and saver.private_choices("s") == [alias]
    assert saver.private_choices("someone else") == []                       # listed only where it was saved
    assert "mine" not in store.names() and alias not in store.names()
    assert not WeightStore(root=tmp_path, registry=load_registry()).installed()  # the store lists none of it
    assert store.get(alias).config.is_encoder_decoder                         # its session loads it by its alias
    with pytest.raises(UserError, match="already saved a run named 'mine'"):
        saver.save("s", "run1", "mine")
    other = saver.private.folder("t", "mine")                                 # another session may use the name
    assert other.parent != folder.parent
    # an hour later it is gone, files and all, and its alias says why
    assert saver.private.expire(now=time.time() + 3601) == [alias]
    assert not folder.exists() and saver.private_choices("s") == []
    fresh = ModelStore()  # a store that never loaded it (a loaded model stays in memory until evicted)
    fresh.private = saver.private_folder
    with pytest.raises(UserError, match="deleted 60 minutes after saving"):
        fresh.get(alias)


def expiry_threads() -> set:
    return {t for t in threading.enumerate() if t.name == "private-runs-expiry"}


def test_a_private_run_expires_on_time_on_an_idle_server_even_once_loaded(trained, tmp_path, monkeypatch):
    """Nothing reads the picker: the expiry thread deletes the run's files when it is due, and the model store
    forgets it, so its alias answers why; a generation already reading the model finishes."""
    from dataclasses import replace

    from ui.services import Services
    from ui.services.generation import stream_generation
    from ui.services.models import ModelStore
    from ui.settings import AppSettings

    lab, _, _ = trained
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(tmp_path))
    before = expiry_threads()
    services = Services.create(AppSettings(lab=replace(SETTINGS, private=True, private_ttl_s=2.0)), ModelStore())
    services.lab._sessions = lab._sessions  # session "s" has run1
    folder = services.lab.save("s", "run1", "brief")
    alias = services.lab.picker_name("s", folder)
    model = services.models.get(alias)
    assert alias in services.models.loaded()
    running = stream_generation(model, "abcd", False, 6, 0.0, None, None, 0)
    first = next(running)  # a request holding the model when it expires
    deadline = time.monotonic() + 30
    while (folder.exists() or alias in services.models.loaded()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not folder.exists(), "the run's files outlived its lifetime on an idle server"
    assert alias not in services.models.loaded(), "the expired run stayed in the model store"
    rest = list(running)
    assert rest[-1].done and rest[-1].n_new >= first.n_new  # the generation under way finished
    with pytest.raises(UserError, match="deleted 2 seconds after saving, and this one has been"):
        services.models.get(alias)
    assert services.lab.private_choices("s") == []
    (thread,) = expiry_threads() - before
    services.lab.private.close()
    assert not thread.is_alive()


def test_on_a_laptop_saved_runs_are_everyones_as_before(tmp_path):
    lab = Lab(SETTINGS, weights_root=tmp_path)
    assert lab.private is None and lab.private_choices("s") == []
    assert LabSettings.from_env({}).private is False
    assert LabSettings.from_env({"SPACE_ID": "someone/space"}).private is True
    assert LabSettings.from_env({}, public=True).private is True
    assert LabSettings.from_env({"ATTN_PRIVATE_RUN_MINUTES": "5"}).private_ttl_s == 300


def test_alignment_counts_where_the_cross_attention_peaks_per_layer():
    import torch

    from core.lab.train import LabAttention
    from core.lab.answers import alignment_note

    cross = torch.zeros(2, 1, 5, 5)  # layer 0: the anti-diagonal of abcd -> dcba; layer 1: always the first source
    cross[0, 0, torch.arange(5), torch.tensor([3, 2, 1, 0, 4])] = 1
    cross[1, 0, :, 0] = 1
    maps = LabAttention([*"abcd", "<eos>"], ["<bos>", *"dcba"], torch.zeros(2, 1, 5, 5), None, cross)
    assert alignment_note("reverse", "abcd", maps).endswith("(the anti-diagonal): layer 0: 4 of 4, layer 1: 1 of 4.")
    source, target = "1999-03-05", "5 March 1999"
    cross = torch.zeros(1, 1, len(target) + 1, len(source) + 1)
    for i, _ in enumerate(target):
        cross[0, 0, i, [8, 5, 0][target[:i].count(" ")]] = 1  # day, month, year fields
    maps = LabAttention([*source, "<eos>"], ["<bos>", *target], torch.zeros(1, 1, 13, 13), None, cross)
    assert alignment_note("dates", source, maps).endswith("source field (day, month or year): layer 0: 10 of 10.")
    assert alignment_note("sort", "321", maps) == ""


def test_the_plots_know_nothing_of_torch_or_gradio():
    code = "import sys, ui.plots.lab; print(sorted({'torch', 'gradio'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with pytest.raises(ValueError, match="do not match"):
        lab_plots.heatmap_grid(np.zeros((1, 1, 2, 3)), ["a"], ["b"], ["x", "y"], ["p", "q"], "t")
    assert lab_plots.token_labels(["a", " ", "a"]) == ["0 a", "1 ␣", "2 a"]


def test_the_server_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATTN_LAB_JOBS", "3")
    monkeypatch.setenv("ATTN_LAB_MAX_SECONDS", "60")
    assert LabSettings.from_env() == LabSettings(max_jobs=3, max_seconds=60.0)
    monkeypatch.setenv("ATTN_LAB_JOBS", "0")
    with pytest.raises(ValueError, match="ATTN_LAB_JOBS must be a number of at least 1, got '0'"):
        LabSettings.from_env()


def test_a_diverged_run_reports_nan_in_words_and_null_in_json():
    lab = Lab(SETTINGS)
    job = lab.train("s", config(steps=2, snapshot_steps=""))
    finish(lab, job)
    record = job.records[0]
    record.run.history[-1].train_loss = float("nan")
    assert record.latest()["train_loss"] is None and "training loss NaN" in record.status_line()
    assert np.isnan(record.curve().train_loss[-1]) and record.row()[6] == "NaN"


def test_the_extrapolation_finding_reads_its_numbers_and_carries_its_caveat():
    """The Lab's positions-past-the-trained-length result, where it is shown (first screen, section): its best kind
    and accuracy read from the result, and the caveat that each kind trained once, on one task."""
    from ui.services.lab import extrapolation as extra
    from ui.views.lab import extrapolation_finding

    result = extra.saved()
    if result is None:
        pytest.skip(f"no saved extrapolation result here ({extra.SAVED_COMMAND} makes it)")
    words = extrapolation_finding(result)
    longest = max(result.config.test_lengths)
    past = [k for k in result.kinds if k.accuracy.get(longest) is not None]
    best = max(past, key=lambda k: k.accuracy[longest])
    assert f"the most accurate is **{best.kind}** ({100 * best.accuracy[longest]:.0f} %)" in words
    assert f"trained once (seed {result.config.seed}, {result.config.steps:,} steps) on one task" in words
    assert words.endswith("may not hold for another seed or task.")
