"""The Lab tab's default snapshot steps show attention that has formed. The formation number is
core.lab.answers.weight_on_source (the weight the rows predicting each output character give the source position the task
says it comes from); the default run is measured with bench/lab_snapshots.py's own function, at the default
snapshot steps and at steps before the run starts to learn, where the snapshots would look blank."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from core.lab import train as engine
from core.lab.answers import weight_on_source
from ui.services.lab.configs import DEFAULT_FIELDS, DEFAULT_SNAPSHOT_STEPS, default_config, parse_steps_list
from ui.settings import LabSettings

BENCH = Path(__file__).resolve().parents[2] / "bench" / "lab_snapshots.py"
BLANK = (50, 150)  # the default run has not started to learn here: its attention is as uniform as at step 0
# between the untrained model's weight (about 1 / len(source), 0.08 here) and bench/lab_snapshots.py's FORMED, with
# room for the small drift a different thread count gives the trajectory (its bits differ, its shape does not)
THRESHOLD = 0.2


def bench_module():
    spec = importlib.util.spec_from_file_location("lab_snapshots", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def cross_maps(source: str, target: str, rows: np.ndarray) -> engine.LabAttention:
    """An encoder-decoder's attention whose cross-attention is `rows` [L, T+1, S+1] in every one of two heads."""
    cross = torch.tensor(rows, dtype=torch.float32)[:, None].expand(-1, 2, -1, -1)
    return engine.LabAttention(list(source) + ["<eos>"], ["<bos>"] + list(target), torch.zeros(1, 2, 1, 1),
                               cross=cross)


def test_weight_on_source_is_one_on_the_task_positions_and_small_when_attention_is_uniform():
    source = "abcdef"
    keys, queries = len(source) + 1, len(source) + 1
    uniform = np.full((queries, keys), 1 / keys)
    mirrored = np.zeros((queries, keys))
    for i in range(len(source)):  # row i predicts output character i, which is source[-1 - i]
        mirrored[i, len(source) - 1 - i] = 1.0
    mirrored[-1, -1] = 1.0
    maps = cross_maps(source, source[::-1], np.stack([uniform, mirrored]))
    assert np.allclose(weight_on_source("reverse", source, maps), [1 / keys, 1.0])
    assert np.allclose(weight_on_source("copy", source, maps)[1], 0.0)  # copy wants the diagonal, not the mirror
    assert weight_on_source("sort", source, maps) is None  # no one source position gives a sorted character


def test_the_tab_trains_the_default_config_with_the_default_snapshots():
    config = default_config(LabSettings())
    assert config.task == DEFAULT_FIELDS["task"] == "reverse" and config.family == "marian" and config.seed == 0
    assert config.snapshot_steps == parse_steps_list(DEFAULT_SNAPSHOT_STEPS, config.steps)
    assert not set(config.snapshot_steps) & set(BLANK)


def test_the_tab_trains_the_cores_default_run_which_the_bench_measures():
    # bench/lab_snapshots.py trains core.lab.train.DEFAULT_RUN: the page's run less the server's time budget
    assert replace(default_config(LabSettings()), time_budget=None) == engine.DEFAULT_RUN
    assert bench_module().DEFAULT_RUN is engine.DEFAULT_RUN


@pytest.mark.slow
def test_the_default_run_forms_its_attention_by_the_snapshot_steps_and_learns_to_reverse():
    """The default run itself (600 steps; about 35 s on 2 free cores), measured after each snapshot step on the
    example the snapshots draw: blank before it starts to learn, formed at every default snapshot step. Evaluation
    is made rare and small: it reads the model in inference mode and draws no random numbers, so the run trains
    exactly as the Lab trains it. At its end (one run serves both checks: it is the suite's longest) the model
    reverses held-out text, each output character looking at its mirror in the source."""
    bench = bench_module()
    config = replace(default_config(LabSettings()), time_budget=None, eval_every=10**6, eval_examples=4)
    assert bench.FORMED > THRESHOLD
    held = engine.examples(config.task, config.seed, 1, True, config.lengths)
    wanted, shown = {*BLANK, *config.snapshot_steps}, {}
    for run, progress in engine.train(config):
        if progress.step in wanted and progress.step not in shown:
            shown[progress.step] = float(bench.formation(run.model, config, held)[0].max())
    assert all(shown[step] < THRESHOLD for step in BLANK), shown
    assert all(shown[step] >= THRESHOLD for step in config.snapshot_steps), shown
    pairs = engine.examples(config.task, config.seed, 100, True, config.lengths)
    assert engine.exact_match(run.model, pairs, seq2seq=True) >= 0.9
    source = "abcdefghij"
    maps = engine.lab_attention(run.model, "marian", source)
    assert "".join(maps.target_tokens[1:]) == source[::-1]
    assert engine.alignment(maps, lambda i: len(source) - 1 - i) >= 0.7
