"""Saved corpus jobs: a finished job reopens without measuring, a stopped or killed one keeps its items and resumes
to the uninterrupted result, leftovers of a kill are ignored, a changed corpus is a new job, exports equal the
summary, the disk cap and prune hold, and nothing on disk is unpickled."""
import csv
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from core import load_model
from core.analysis import heads, patching
from core.analysis import over as overs
from core.corpus import Pair, saved
from tests import tiny

ANSWER, FOIL = 11, 23
N = 4


@pytest.fixture(scope="module")
def folder():
    return tiny.save(tiny.llama(num_key_value_heads=2))


@pytest.fixture(scope="module")
def llama(folder):
    return load_model(folder, device="cpu")


def random_pairs(n=N, length=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        clean = torch.randint(3, tiny.VOCAB - 1, (length,), generator=gen)
        corrupted = clean.clone()
        corrupted[2] = (clean[2] + 7) % (tiny.VOCAB - 3) + 3
        pairs.append(Pair(clean, corrupted, ANSWER, FOIL))
    return pairs


def random_texts(lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB - 1, (n,), generator=gen) for n in lengths]


@pytest.fixture
def sweeps(monkeypatch):
    """Counts the pairs patch_over's sweeps measure (patching.sweep_pairs yields each); .refuse = True makes any
    fail the test. Each pair is swept in a batch of its own (PAIR_TOKENS 7: the pairs' length), so a stop lands
    between two pairs, as these tests of saving and resuming want."""
    real = patching.sweep_pairs

    class Counter:
        calls = 0
        refuse = False

        def __call__(self, *args, **kw):
            for row, sweep in real(*args, **kw):
                assert not self.refuse, "a saved item was measured again"
                self.calls += 1
                yield row, sweep

    counter = Counter()
    monkeypatch.setattr(patching, "sweep_pairs", counter)
    monkeypatch.setattr(overs, "PAIR_TOKENS", 7)
    return counter


def assert_same_over(a, b, atol=0.0):
    assert a.n == b.n and a.items == b.items and a.note == b.note
    for key in ("mean", "low", "high", "per_item"):
        assert getattr(a, key).dtype == getattr(b, key).dtype
        torch.testing.assert_close(getattr(a, key), getattr(b, key), atol=atol, rtol=0, equal_nan=True)


def item_files(run):
    return sorted(p.name for p in (run.folder / "items").iterdir() if not p.name.startswith("."))


def test_a_job_is_saved_and_reopened_without_measuring(llama, sweeps, tmp_path):
    pairs = random_pairs()
    run = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z")
    assert run.finished and run.measured == N and run.reused == 0 and sweeps.calls == N
    assert_same_over(run.result, overs.patch_over(llama, pairs, "z"))
    assert item_files(run) == [f"{i:06d}.npz" for i in range(N)]
    meta = saved.read_json(run.folder / "meta.json")
    assert meta["model"] == "tiny-llama" and meta["analysis"] == "patch" and meta["items"] == N
    assert meta["arguments"] == {"site": "z", "mode": "denoise", "layer": None}
    assert meta["corpus"] == saved.corpus_hash(pairs) and meta["version"] and meta["version_from"]
    assert meta["created"] <= meta["finished"] and meta["parts"]["over"]["axes"] == ["layer", "head"]

    sweeps.refuse = True                                   # reopening measures nothing
    again = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z", mode="denoise")
    assert again.folder == run.folder and again.finished and again.measured == 0 and again.reused == N
    assert_same_over(again.result, run.result)
    assert_same_over(saved.open_job(run.folder).result, run.result)
    assert [job["folder"] for job in saved.jobs(tmp_path)] == [str(run.folder)]


def test_a_stopped_job_keeps_its_items_and_resumes_the_rest(llama, sweeps, tmp_path):
    pairs, k = random_pairs(), 2
    whole = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path / "whole", "tiny-llama", site="z").result
    sweeps.calls = 0
    kept = []
    half = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path / "jobs", "tiny-llama", site="z",
                          each=lambda i, value: kept.append(i), stop=lambda: len(kept) >= k)
    assert not half.finished and half.measured == k and half.result.n == k and "stopped" in half.result.note
    assert not (half.folder / "meta.json").exists() and item_files(half) == ["000000.npz", "000001.npz"]
    on_disk = saved.read_items(half.folder, N)
    assert sorted(on_disk) == [0, 1]
    torch.testing.assert_close(torch.stack([on_disk[0], on_disk[1]]), half.result.per_item, atol=0, rtol=0)

    sweeps.calls, seen = 0, []
    resumed = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path / "jobs", "tiny-llama", site="z",
                             progress=lambda done, total: seen.append(done))
    assert sweeps.calls == N - k and resumed.reused == k and resumed.measured == N - k and resumed.finished
    assert seen[0] == k and seen[-1] == N                  # progress counts the items read back at once
    assert_same_over(resumed.result, whole, atol=1e-6)


KILLED = """
import os, signal, sys
from core import load_model
from core.analysis import over as overs
from core.corpus import saved
from tests.core.test_corpus_saved import random_pairs
saved.code_version = lambda: (sys.argv[3], sys.argv[4])    # the test's, should a commit land meanwhile
finished = []
def each(index, value):
    finished.append(index)
    if len(finished) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
saved.run_over(overs.ANALYSES["patch"], load_model(sys.argv[1], device="cpu"), random_pairs(), sys.argv[2],
               "tiny-llama", site="z", each=each)
"""


def test_a_killed_process_leaves_its_items_and_the_job_resumes(folder, llama, sweeps, tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED, folder, str(tmp_path), *saved.code_version()],
                            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
                            check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (job,) = saved.jobs(tmp_path)
    assert not job["finished"] and sorted(saved.read_items(Path(job["folder"]), N)) == [0, 1]
    resumed = saved.run_over(overs.ANALYSES["patch"], llama, random_pairs(), tmp_path, "tiny-llama", site="z")
    assert str(resumed.folder) == job["folder"] and resumed.reused == 2 and sweeps.calls == N - 2
    # the child swept its pairs in one batch and the resume one by one: float32 rounds the two batch shapes apart
    assert_same_over(resumed.result, overs.patch_over(llama, random_pairs(), "z"), atol=1e-5)


def test_leftovers_of_a_kill_are_ignored(llama, sweeps, tmp_path):
    pairs = random_pairs()
    kept = []
    half = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z",
                          each=lambda i, value: kept.append(i), stop=lambda: len(kept) >= 2)
    whole_item = (half.folder / "items" / "000000.npz").read_bytes()
    (half.folder / "items" / ".000002.npz.tmp-1a2b3c4d").write_bytes(whole_item[: len(whole_item) // 2])
    (half.folder / "items" / "000003.npz").write_bytes(whole_item[: len(whole_item) // 2])   # truncated by a crash
    assert sorted(saved.read_items(half.folder, N)) == [0, 1]
    sweeps.calls = 0
    resumed = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z")
    assert sweeps.calls == 2 and resumed.reused == 2
    assert_same_over(resumed.result, overs.patch_over(llama, pairs, "z"), atol=1e-6)


def test_a_changed_corpus_is_a_new_job(llama, sweeps, tmp_path):
    pairs = random_pairs()
    first = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z")
    changed = list(pairs)
    token = changed[3].clean.clone()
    token[0] = (token[0] + 1) % tiny.VOCAB
    changed[3] = Pair(token, changed[3].corrupted, ANSWER, FOIL)
    other_foil = [Pair(p.clean, p.corrupted, ANSWER, FOIL + 1) for p in pairs]
    hashes = {saved.corpus_hash(c) for c in (pairs, changed, other_foil, pairs[:3], random_pairs(seed=0))}
    assert len(hashes) == 4                               # the same pairs drawn again hash the same
    sweeps.calls = 0
    second = saved.run_over(overs.ANALYSES["patch"], llama, changed, tmp_path, "tiny-llama", site="z")
    assert second.folder != first.folder and sweeps.calls == N and second.reused == 0
    with pytest.raises(ValueError, match="a mix"):
        saved.corpus_hash([pairs[0], pairs[0].clean])


def test_head_scores_and_attribution_resume_and_reopen(llama, tmp_path, monkeypatch):
    texts = random_texts([9, 4, 13, 6, 9, 12, 5])
    texts[2][8:] = texts[2][3:8]
    whole = overs.head_scores_over(llama, texts, batch_tokens=30)
    batches = []
    stopped = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny-llama", batch_tokens=30,
                             each=lambda i, value: batches.append(i), stop=lambda: len(batches) >= 2)
    on_disk = len(item_files(stopped))
    assert not stopped.finished and 2 <= on_disk < len(texts) and on_disk == len(batches)
    real, rows = heads.batch_pattern_scores, []
    monkeypatch.setattr(heads, "batch_pattern_scores",
                        lambda model, ids, *rest: rows.append(len(ids)) or real(model, ids, *rest))
    resumed = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny-llama", batch_tokens=30)
    assert resumed.finished and resumed.reused == on_disk and sum(rows) == len(texts) - on_disk
    assert resumed.reused + resumed.measured == len(texts) and set(resumed.result) == set(whole)
    reopened = saved.open_job(resumed.folder).result
    for kind in whole:
        assert_same_over(resumed.result[kind], whole[kind], atol=1e-6)
        assert_same_over(reopened[kind], resumed.result[kind])

    pairs = random_pairs(4)
    heads_over, mlps_over = saved.run_over(overs.ANALYSES["logit_attribution"], llama, pairs, tmp_path, "tiny-llama").result
    want = overs.logit_attribution_over(llama, pairs)
    assert_same_over(heads_over, want[0]) and assert_same_over(mlps_over, want[1])
    back = saved.run_over(overs.ANALYSES["logit_attribution"], llama, pairs, tmp_path, "tiny-llama")
    assert back.measured == 0 and isinstance(back.result, tuple)
    assert_same_over(back.result[1], want[1])


def test_the_reasons_items_were_left_out_are_saved_and_old_jobs_still_open(llama, tmp_path):
    texts = random_texts([9, 4, 6])
    texts[2] = torch.cat([texts[2], texts[2]])      # the one span repeated once: the others are left out of induction
    run = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny-llama")
    assert run.result["induction"].left_out == {0: "not a span repeated once", 1: "not a span repeated once"}
    assert saved.open_job(run.folder).result["induction"].left_out == run.result["induction"].left_out
    meta = saved.read_json(run.folder / saved.META)
    for part in meta["parts"].values():   # a job saved before parts had left_out: only its note names them
        del part["left_out"]
    saved.write_json(run.folder / saved.META, meta)
    old = saved.open_job(run.folder).result["induction"]
    assert old.left_out == {} and "text 0 (not a span repeated once)" in old.note


def test_ablation_saves_the_texts_it_sweeps(llama, tmp_path):
    texts = random_texts([5, 6, 4])
    run = saved.run_over(overs.ANALYSES["ablation"], llama, texts, tmp_path, "tiny-llama", limit=2)
    assert run.measured == 2 and run.result.n == 2 and len(item_files(run)) == 2 and "first 2 of 3" in run.result.note
    assert_same_over(run.result, overs.ablation_over(llama, texts, limit=2), atol=1e-6)
    assert_same_over(saved.open_job(run.folder).result, run.result)


def test_a_bfloat16_item_reads_back_exactly(tmp_path):
    value = {"a": torch.randn(2, 4).to(torch.bfloat16), "b": torch.randn(3, dtype=torch.float64)}
    (tmp_path / "items").mkdir()
    saved.write_item(tmp_path, 5, value)
    saved.write_item(tmp_path, 6, (torch.ones(2), torch.zeros(3)))
    back = saved.read_items(tmp_path, 7)
    assert back[5]["a"].dtype == torch.bfloat16 and torch.equal(back[5]["a"], value["a"])
    assert back[5]["b"].dtype == torch.float64 and torch.equal(back[5]["b"], value["b"])
    assert isinstance(back[6], tuple) and torch.equal(back[6][1], torch.zeros(3))
    assert saved.read_items(tmp_path, 6).keys() == {5}     # an index past the corpus is not read


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.reader(file))


def test_export_equals_the_over(llama, tmp_path):
    pairs = random_pairs(5)  # five: the fewest that get an interval
    run = saved.run_over(overs.ANALYSES["logit_attribution"], llama, pairs, tmp_path / "jobs", "org/tiny llama")
    files = saved.export(run.folder, tmp_path / "out")
    stem = f"org-tiny-llama_logit_attribution_{saved.corpus_hash(pairs)[:12]}"
    assert sorted(p.name for p in files) == sorted(
        [f"{stem}.npz", f"{stem}_heads.csv", f"{stem}_heads_items.csv", f"{stem}_mlps.csv", f"{stem}_mlps_items.csv"])
    for name, over in zip(("heads", "mlps"), run.result):
        cells = read_csv(tmp_path / "out" / f"{stem}_{name}.csv")
        axes = ["layer", "head"] if name == "heads" else ["layer"]
        assert cells[0] == [*axes, "mean", "low", "high", "n"] and len(cells) == 1 + over.mean.numel()
        for row in cells[1:]:
            cell = tuple(int(v) for v in row[:len(axes)])
            mean, low, high = (float(v) for v in row[len(axes):-1])
            assert (mean, low, high) == (over.mean[cell].item(), over.low[cell].item(), over.high[cell].item())
            assert int(row[-1]) == over.n == 5
        items = read_csv(tmp_path / "out" / f"{stem}_{name}_items.csv")
        assert items[0] == ["item", *axes, "value"] and len(items) == 1 + over.per_item.numel()
        for row in items[1:]:
            index = (int(row[0]), *(int(v) for v in row[1:-1]))
            assert float(row[-1]) == over.per_item[index].item()
    with np.load(tmp_path / "out" / f"{stem}.npz", allow_pickle=False) as arrays:
        for name, over in zip(("heads", "mlps"), run.result):
            for key in ("mean", "low", "high", "per_item"):
                assert np.array_equal(arrays[f"{name}.{key}"], getattr(over, key).numpy())
            assert arrays[f"{name}.items"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="no finished job"):
        saved.export(tmp_path / "jobs", tmp_path / "out")


def test_the_disk_cap_refuses_a_new_job_and_prune_deletes_old_ones(llama, tmp_path):
    pairs = random_pairs(3)
    root = tmp_path / "page"
    first = saved.run_over(overs.ANALYSES["patch"], llama, pairs, root, "tiny-llama", site="z")
    used = saved.disk_usage(root)
    assert used > 0
    with pytest.raises(ValueError, match="cap of"):
        saved.run_over(overs.ANALYSES["patch"], llama, pairs, root, "tiny-llama", site="z", mode="noise", max_bytes=used)
    assert [p.name for p in root.iterdir()] == [first.folder.name]        # nothing started
    assert saved.run_over(overs.ANALYSES["patch"], llama, pairs, root, "tiny-llama", site="z", max_bytes=used).finished  # reopens
    second = saved.run_over(overs.ANALYSES["patch"], llama, pairs, root, "tiny-llama", site="z", mode="noise", max_bytes=2 * used)
    assert second.finished

    (root / "notes").mkdir()                               # not a job: never touched
    old = time.time() - 7200
    for path in [first.folder, *first.folder.rglob("*")]:
        os.utime(path, (old, old))
    assert saved.prune(root, 3 * 3600) == []
    assert saved.prune(root, 3600) == [first.folder]
    assert sorted(p.name for p in root.iterdir()) == sorted(["notes", second.folder.name])
    assert saved.prune(root, 3600, now=time.time() + 7200) == [second.folder]
    with pytest.raises(ValueError, match="0 or more"):
        saved.prune(root, -1)


class Trap:
    """Unpickling an instance records it (what a hostile file would run instead)."""
    sprung: ClassVar[list] = []

    def __reduce__(self):
        return (Trap.sprung.append, ("unpickled",))


def test_nothing_is_unpickled(llama, sweeps, tmp_path, monkeypatch):
    pairs = random_pairs(4)
    kept = []
    half = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z",
                          each=lambda i, value: kept.append(i), stop=lambda: len(kept) >= 2)
    np.savez(half.folder / "items" / "000002.npz", tensor=np.array([Trap()], dtype=object),
             dtypes=np.array(["tensor=float32"]))
    for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
        monkeypatch.setattr(module, name, lambda *a, **kw: pytest.fail("something was unpickled"))
    sweeps.calls = 0
    resumed = saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "tiny-llama", site="z")
    assert Trap.sprung == [] and sweeps.calls == 2 and resumed.reused == 2
    assert_same_over(saved.open_job(resumed.folder).result, resumed.result)


def test_wrong_requests_name_what_is_wrong(llama, tmp_path):
    pairs, texts = random_pairs(2), random_texts([5, 6])
    with pytest.raises(ValueError, match="analysis must be one of"):
        saved.run_over(overs.analysis_named("probe"), llama, pairs, tmp_path, "m")
    with pytest.raises(ValueError, match="takes the arguments site, mode, layer"):
        saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "m", site="z", sight=1)
    with pytest.raises(ValueError, match="needs the argument"):
        saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "m")
    with pytest.raises(ValueError, match="runs over pairs"):
        saved.run_over(overs.ANALYSES["patch"], llama, texts, tmp_path, "m", site="z")
    with pytest.raises(ValueError, match="runs over texts"):
        saved.run_over(overs.ANALYSES["head_scores"], llama, pairs, tmp_path, "m")
    with pytest.raises(ValueError, match="site must be one of"):             # the analysis's own refusal
        saved.run_over(overs.ANALYSES["patch"], llama, pairs, tmp_path, "m", site="nowhere")
    assert list(tmp_path.iterdir()) == []                  # a refused job leaves no folder behind


def test_default_root(tmp_path, monkeypatch):
    assert saved.default_root({"ATTN_RUNS_DIR": str(tmp_path / "x")}) == tmp_path / "x"
    assert saved.default_root({}) == saved.DEFAULT_ROOT
    monkeypatch.setattr(saved, "PERSISTENT_STORAGE", tmp_path)
    assert saved.default_root({"SPACE_ID": "me/space"}) == tmp_path / "runs"
    assert saved.default_root({"SPACE_ID": "me/space", "ATTN_RUNS_DIR": "/elsewhere"}) == saved.Path("/elsewhere")
    monkeypatch.setattr(saved, "PERSISTENT_STORAGE", tmp_path / "missing")
    assert saved.default_root({"SPACE_ID": "me/space"}) == saved.DEFAULT_ROOT


def test_the_code_version_says_where_it_came_from(tmp_path, monkeypatch):
    version, version_from = saved.code_version()
    assert version and version_from in ("git describe", "sha256 of core/*.py")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "model.py").write_text("x = 1\n")
    monkeypatch.setattr(saved, "REPO", tmp_path)                 # a copy without .git, as on a Space
    saved.code_version.cache_clear()
    try:
        first = saved.code_version()
        (tmp_path / "core" / "model.py").write_text("x = 2\n")
        saved.code_version.cache_clear()
        second = saved.code_version()
    finally:
        saved.code_version.cache_clear()
    assert first[1] == second[1] == "sha256 of core/*.py" and first[0].startswith("core-") and first[0] != second[0]
