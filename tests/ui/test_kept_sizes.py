"""What the KeptStore counts and what a session's State holds for it (ui/services/kept.py), without Gradio: a kept
value's size is the sum of its tensors' numel × element size, its arrays' and texts' bytes; a view keeps its value
under the session's ticket and hands the State a KeptRef; a miss gives the view None, so it recomputes."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np
import torch

from ui.services.kept import KeptRef, KeptStore, keeping, nbytes_of


@dataclass
class Results:
    scores: dict = field(default_factory=dict)
    table: np.ndarray | None = None
    label: str = ""


def test_a_values_size_is_its_tensors_arrays_and_texts():
    shared = torch.zeros(3, 4, dtype=torch.float16)  # 12 × 2 bytes
    value = Results({"a": shared, "b": shared, "c": torch.ones(5, dtype=torch.float64)}, np.zeros((2, 3), np.float32),
                    "seven!!")
    # the shared tensor once; the dict's keys and the label are text
    assert nbytes_of(value) == 24 + 40 + 24 + len("abc") + len("seven!!")
    assert nbytes_of([value, value]) == nbytes_of(value)  # one object held twice is held once
    assert nbytes_of(None) == nbytes_of(7) == 0


def test_a_kept_value_is_found_by_its_ref_and_counted_against_the_budget():
    kept = KeptStore(budget_bytes=10_000)
    big = Results({"s": torch.zeros(1000, dtype=torch.float32)})  # 4,000 bytes
    ref = kept.keep(big, ("heads",))
    assert kept.find(ref) is big and kept.nbytes == 4000 + 1
    again = kept.keep(Results(), ("heads",), ref)
    assert again.ticket == ref.ticket and len(kept) == 1 and kept.nbytes == 0  # the session's entry, replaced
    assert len(pickle.dumps(ref)) < 512  # what the session's State holds
    for i in range(3):  # other sessions fill the budget: the oldest goes first
        kept.keep(Results({"s": torch.zeros(1000)}), ("heads",))
    assert kept.find(again) is None and kept.find(None) is None and kept.nbytes <= kept.budget_bytes


def test_a_view_gets_its_kept_value_back_and_recomputes_after_a_miss():
    kept = KeptStore(budget_bytes=10**6)
    computed = []

    def view(services, text, previous=None):
        if previous is None or previous.label != text:
            previous = Results({"n": torch.arange(len(text))}, label=text)
            computed.append(text)
        return f"{len(previous.label)} characters", previous

    event = keeping(view, kept, ("demo",))
    note, ref = event(None, "lamp")
    assert note == "4 characters" and isinstance(ref, KeptRef) and computed == ["lamp"]
    assert event(None, "lamp", previous=ref)[1] == ref and computed == ["lamp"]  # reused
    kept.put("someone else", ("x",), None, kept.budget_bytes)  # the budget drops it
    assert event(None, "lamp", previous=ref)[1].ticket == ref.ticket and computed == ["lamp", "lamp"]

    def streamed(services, previous=None):
        for n in range(3):
            yield n, Results({"n": torch.zeros(n + 1)})

    refs = [ref for _, ref in keeping(streamed, kept, ("stream",))(None)]
    assert len({r.ticket for r in refs}) == 1 and kept.find(refs[-1]).scores["n"].numel() == 3
