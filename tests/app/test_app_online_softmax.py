"""The online_softmax endpoint through gradio_client on the tiny app Llama: the figure holds the followed row's
softmax read a block at a time, equal to the pass's own weights, the note says the difference, the table shows the
shipped measurement and, apart, the formula's count from the shapes, and bad settings are named."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import anatomy  # noqa: E402
from core.attention import softmax_bytes  # noqa: E402
from ui.services.inside import online_softmax_memory  # noqa: E402
from ui.views.online import mib  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app, plotly_array  # noqa: E402

TEXT = "the bread is warm and the lamp"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llama = str(build_tiny_llama(tmp_path_factory.mktemp("online-models") / "tiny-llama"))
    demo, url, services = launch_app([llama], llama)
    yield dict(llama=llama, services=services, client=Client(url, verbose=False))
    demo.close()


def test_the_endpoint_reads_the_walked_row_block_by_block(served):
    model = served["services"].models.get(served["llama"])
    ids = torch.tensor([model.tokenizer(TEXT).input_ids])
    stages = anatomy.forward_stages(model, ids, 1, 2)
    n = ids.shape[1]
    note, plot, table = served["client"].predict(served["llama"], TEXT, 1, 2, -1, 3, api_name="/online_softmax")
    data = {t["name"]: t for t in json.loads(plot["plot"])["data"]}
    np.testing.assert_allclose(plotly_array(data["plain softmax"]["y"]), stages.probs[-1].numpy(), atol=1e-6)
    np.testing.assert_allclose(plotly_array(data["online softmax"]["y"]), stages.probs[-1].numpy(), atol=1e-6)
    assert len(data["running sum ℓ"]["x"]) == -(-n // 3)                       # ⌈n / 3⌉ blocks
    difference = float(note.split("differ from the pass's softmax by at most **")[1].split("**")[0])
    assert difference <= 1e-6
    assert "eq. 6.10" in note and f"query {n - 1}" in note
    plain, online = softmax_bytes(8192, 8192, 3, stages.v.shape[-1]).values()      # blocks of 3, this head's d_head
    assert f"| 8,192 | 512.00 MiB | {mib(online)} | {plain / online:,.1f}× |" in table
    memory = online_softmax_memory()                                           # the shipped measurement, apart
    assert table.index("**Measured**") < table.index("**Formula, not a measurement**")
    assert f"| {memory.rows[-1].n:,} | {memory.rows[-1].plain / 2 ** 20:,.2f} MiB |" in table


@pytest.mark.parametrize("args, words", [((1, 2, -1, 0), "Block size"), ((1, 2, 99, 3), "Token to follow"),
                                         ((5, 2, -1, 3), "[Ll]ayer")])
def test_bad_settings_are_named(served, args, words):
    with pytest.raises(AppError, match=words):
        served["client"].predict(served["llama"], TEXT, *args, api_name="/online_softmax")
