"""bench/variants/approx_cost.py at tiny sizes: its measurements run end to end in fresh processes, its JSON has the keys
its docstring documents, its decode steps compute what the core's kernels compute, its byte counts follow the
shapes read, and its rules (the crossover length, the linear check, the skips, the device) decide as they say.
Nothing here is timed: the assertions are on structure and logic, never on speed."""
from __future__ import annotations

import json
import math
import sys
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from variants import approx_cost as bench  # noqa: E402

from core.approx import approximate  # noqa: E402

TINY = dict(topk=16, block=16, global_blocks=1, random_blocks=2, features=32, rank=8, linformer_rank=16,
            online_block=32)


def setup(**more) -> bench.Setup:
    return bench.Setup(**bench.smollm2_shape(), **{**TINY, **more})


def args(**more) -> Namespace:
    base = dict(lengths=[64, 128], decode_lengths=[128], repeats=1, peak_repeats=1, decode_repeats=1, fit_from=64,
                memory_share=0.6, method_seconds=300.0)
    return Namespace(**{**base, **more})


def test_the_shape_is_smollm2s_and_the_device_choice_is_checked(monkeypatch):
    assert bench.smollm2_shape() == {"heads": 9, "kv_heads": 3, "d_head": 64, "d_model": 576}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.resolve_device("auto") == "cpu" and bench.resolve_device("cpu") == "cpu"
    with pytest.raises(SystemExit, match="no GPU"):
        bench.resolve_device("cuda")
    with pytest.raises(SystemExit, match="auto, cpu or cuda"):
        bench.resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.resolve_device("auto") == "cuda" and bench.resolve_device("cuda") == "cuda"


def test_a_tiny_run_end_to_end_writes_the_documented_json(tmp_path):
    s = setup(cap=int(0.6 * bench.memory_available("cpu")))
    a = args()
    rows = bench.layer_runs(s, a)
    decode = bench.decode_runs(s, a)
    data = json.loads(json.dumps(bench.run_record(a, s, rows, decode, bench.memory_available("cpu"))))
    assert {"date", "machine", "command", "device", "threads", "load_average", "load", "shape", "budgets", "repeats",
            "peak_repeats", "decode_repeats", "methods", "causal", "bidirectional", "rule", "rows", "fits",
            "crossover", "decode"} <= set(data)
    assert set(data["rule"]) == {"memory_available", "memory_share", "cap", "method_seconds", "words"}
    assert [r["n"] for r in data["rows"]] == [64, 128]
    for r in data["rows"]:
        assert set(r) == {"n", "methods", "skipped"} and r["skipped"] == {}
        assert set(r["methods"]) == set(bench.METHODS)
        for m, got in r["methods"].items():
            assert set(got) == {"seconds", "peaks", "error", "head_errors"}
            assert len(got["seconds"]) == 1 and len(got["peaks"]) == 1
            assert (got["error"] is None) == (m not in bench.REFERENCE)
        # the explicit path and the online softmax (a causal call, block by block) compute exact attention
        assert r["methods"]["eager"]["error"] < 1e-5 and r["methods"]["online"]["error"] < 1e-5
        assert len(r["methods"]["topk"]["head_errors"]) == 9
    # 64 tokens in blocks of 16: BigBird's window, global and two random blocks cover every earlier block
    assert data["rows"][0]["methods"]["bigbird"]["error"] < 1e-5
    assert data["rows"][1]["methods"]["topk"]["error"] > 1e-3          # 16 of up to 128 keys: not exact
    assert set(data["fits"]) == {"fit_from", "methods", "linear_check"}
    for m in bench.METHODS:
        assert set(data["fits"]["methods"][m]) == {"time", "peak"}
        assert data["fits"]["methods"][m]["time"]["lengths"] == [64, 128]
    assert set(data["fits"]["linear_check"]) == set(bench.LINEAR)
    assert [c["method"] for c in data["crossover"]] == list(bench.APPROXIMATIONS)
    for c in data["crossover"]:
        assert {"method", "reference", "n", "interpolated_n", "ratio", "error", "up_to", "stays_below",
                "words"} <= set(c) and c["up_to"] == 128
    assert data["decode"]["contexts"] == [128]
    assert {r["method"] for r in data["decode"]["rows"]} == set(bench.DECODE_METHODS)
    markdown = bench.table(data)
    for m in bench.METHODS + bench.DECODE_METHODS:
        assert m in markdown
    assert "nothing: every method reached every length" in markdown


def hand_rows(times: dict[str, list[float]], lengths=(256, 512, 1024, 2048), errors=None) -> list[dict]:
    errors = errors or {}
    return [{"n": n, "skipped": {}, "methods": {m: {"seconds": [t[i]], "peaks": [2 ** 20 * n], "error":
                                                     errors.get(m, [None] * len(lengths))[i], "head_errors": None}
                                                 for m, t in times.items()}}
            for i, n in enumerate(lengths)]


def test_the_crossover_is_the_first_length_below_the_reference_interpolated_on_log_log():
    rows = hand_rows({"sdpa": [1, 4, 16, 64], "bigbird": [2, 5, 8, 16], "topk": [2, 8, 32, 128],
                      "performer": [0.5, 5, 8, 70]}, errors={"bigbird": [0.1, 0.2, 0.3, 0.4]})
    c = bench.crossover(rows, "bigbird", "sdpa")
    assert c["n"] == 1024 and c["ratio"] == pytest.approx(0.5) and c["error"] == pytest.approx(0.3)
    above, below = math.log(5 / 4), math.log(8 / 16)
    assert c["interpolated_n"] == pytest.approx(512 * 2 ** (above / (above - below)))
    assert 512 < c["interpolated_n"] < 1024 and c["stays_below"]
    assert c["words"].startswith("1,024 (≈ ")
    none = bench.crossover(rows, "topk", "sdpa")
    assert none["n"] is None and none["interpolated_n"] is None and none["words"] == "none up to 2,048"
    first = bench.crossover(rows, "performer", "sdpa")
    assert first["n"] == 256 and first["interpolated_n"] is None and not first["stays_below"]
    assert first["words"] == "already at 256, the shortest length measured, not below at every longer length"
    # a method measured at fewer lengths is compared only where both ran
    rows[-1]["methods"].pop("sdpa")
    assert bench.crossover(rows, "bigbird", "sdpa")["up_to"] == 1024


def test_the_linear_check_reads_the_fitted_time_exponent():
    lengths = (2048, 4096, 8192, 16384)
    rows = hand_rows({m: [1e-6 * n ** k for n in lengths] for m, k in
                      zip(bench.METHODS, (2, 2, 2, 2, 1.05, 1.5, 2, 2, 2, 1))}, lengths)
    checked = bench.fits(rows, 2048)["linear_check"]
    assert checked["bigbird"]["holds"] and checked["bigbird"]["exponent"] == pytest.approx(1.05)
    assert not checked["performer"]["holds"] and checked["performer"]["exponent"] == pytest.approx(1.5)
    assert checked["bigbird"]["lengths"] == list(lengths)
    assert bench.fits(rows, 4096)["methods"]["sdpa"]["time"]["lengths"] == [4096, 8192, 16384]


def test_the_rule_skips_a_method_whose_peak_grown_as_n_squared_passes_the_cap():
    rows = hand_rows({"eager": [1e-3, 4e-3, 16e-3, 64e-3], "sdpa": [1e-3] * 4})
    rows[-1]["methods"]["eager"]["peaks"] = [3 * 2 ** 30]          # 3 GiB at 2,048: 12 GiB at 4,096
    s = setup(cap=10 * 2 ** 30)
    run, skipped = bench.plan(4096, rows, ("eager", "sdpa", "online"), s, args(repeats=5, peak_repeats=5))
    assert run == ["sdpa", "online"] and "12.0 GiB, over the cap of 10.0 GiB" in skipped["eager"]
    slow = hand_rows({"online": [1.0, 2.0, 4.0, 10.0]})
    run, skipped = bench.plan(4096, slow, ("online",), setup(), args(repeats=5, peak_repeats=5, method_seconds=100))
    assert run == [] and "--method-seconds 100" in skipped["online"]
    rows[-1]["skipped"] = {"topk": "its peak …"}
    assert bench.plan(8192, rows, ("topk",), s, args())[1] == {"topk": "not run past 2,048 tokens"}


def test_the_decode_steps_compute_the_cores_kernels_and_count_the_bytes_they_read():
    s = setup()
    n = 200                                            # not a whole number of BigBird blocks
    st = bench.decode_state(n, s)
    with torch.inference_mode():
        core_bigbird = approximate(st["q1"], st["k"], st["v"], s.approx("bigbird"), layer=0, is_causal=True)[0]
        torch.testing.assert_close(bench.bigbird_decode(st, s), core_bigbird)
        q_f, _ = bench.favor_features(st["q1"], st["k"], s.d_head ** -0.5, s.features, 0)
        core_performer = approximate(st["q1"], st["k"], st["v"], s.approx("performer"), layer=0)[0]
        torch.testing.assert_close(bench.performer_readout(q_f, st["state"], st["normaliser"]), core_performer)
        assert bench.performer_step(st, s).shape == (1, 9, 1, 64)
        exact = bench.DECODE_CALLS["sdpa"](st, s)
        torch.testing.assert_close(bench.online_decode(st, s), exact, atol=1e-5, rtol=1e-4)
    every = 2 * 3 * n * 64 * 4                          # keys and values, 3 kv heads of 64, float32
    for m in ("sdpa", "eager", "online", "topk", "bigbird", "performer"):
        assert bench.bytes_read(m, st) == every
    assert bench.bytes_read("lowrank_kv", st) == n * s.rank * 4
    assert bench.bytes_read("performer_state", st) == 3 * (s.features * 64 + s.features) * 4
    # the newest query sits in block 12 of 13 (200 = 12·16 + 8): its own 8 keys, block 11, block 0, two random
    assert bench.bytes_read("bigbird_blocks", st) == (8 + 16 * 4) * 2 * 3 * 64 * 4


def test_the_saved_run_if_any_has_the_documented_keys():
    """The shipped JSON (written by --publish) holds what the page reads."""
    if not bench.ASSET.is_file():
        pytest.skip("no saved run yet: OMP_NUM_THREADS=1 python bench/variants/approx_cost.py --publish writes it")
    data = json.loads(bench.ASSET.read_text(encoding="utf-8"))
    assert {"rows", "fits", "crossover", "decode", "machine", "date", "command", "rule"} <= set(data)
    assert data["command"].endswith("bench/variants/approx_cost.py --publish")
    assert {c["method"] for c in data["crossover"]} == set(bench.APPROXIMATIONS)
    assert all(set(r["methods"]) | set(r["skipped"]) == set(bench.METHODS) for r in data["rows"])
    assert bench.table(data).count("| tokens n |") >= 6
    assert asdict(setup())["heads"] == data["shape"]["heads"]
