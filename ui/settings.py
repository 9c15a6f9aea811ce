"""Every setting of the app, read from the environment once (AppSettings.from_env) and checked.

Nothing here reads the environment at import time: `python app.py` calls from_env() in main and hands the
result to the services and the page; tests build AppSettings() with the defaults, or with their own values.

    ATTN_MAX_TEXT_MB        one cap for typed and uploaded text (default 1 MB)
    ATTN_KEPT_BUDGET_MB     what all sessions keep for reuse together: captures, generation rows (default 1000)
    ATTN_SESSIONS           sessions whose state Gradio keeps; the oldest is dropped beyond it (default 500)
    ATTN_LAB_JOBS, ATTN_LAB_MAX_STEPS, ATTN_LAB_MAX_SECONDS, ATTN_LAB_EVAL_EXAMPLES   the Lab's limits
    ATTN_PRIVATE_RUN_MINUTES   how long a saved run is kept on a shared server (a Space, --public; default 60):
                            a Lab run after it was saved, a corpus job after its last write
    ATTN_PRIVATE_CORPUS_MB  on a shared server, the saved corpus jobs one page may keep (default 20 MB)
    ATTN_CORPUS_MAX_SECONDS the longest one corpus job or extrapolation run runs (default 600 s): it stops there,
                            keeping its finished items (or kinds)
    ATTN_PUBLIC_FETCH_MB    on a shared server, the largest model a choice fetches, by its memory in float32 as the
                            registry records it (default 2000); an installed model loads whatever its size
    ATTN_WEIGHTS_DIR        where the weight store lives (read by core.store itself)
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

TEXT_CAP_SETTING = "ATTN_MAX_TEXT_MB"
KEPT_BUDGET_SETTING = "ATTN_KEPT_BUDGET_MB"
SESSIONS_SETTING = "ATTN_SESSIONS"
CORPUS_PAGE_SETTING = "ATTN_PRIVATE_CORPUS_MB"
CORPUS_SECONDS_SETTING = "ATTN_CORPUS_MAX_SECONDS"
PUBLIC_FETCH_SETTING = "ATTN_PUBLIC_FETCH_MB"
DEFAULT_TEXT_BYTES = 1_000_000
MAX_ATTENTION_TOKENS = 2048  # default cap of the Attention tab: a capture on 2 CPU cores stays within seconds


class SettingError(ValueError):
    """A setting in the environment that is not a number in its range: the message names it."""


def env_number(name: str, default, low, kind=float, strict: bool = False, environ: Mapping[str, str] | None = None):
    """A setting from the environment: a number of at least `low`, else `default` when unset. A bad value is a
    SettingError naming the setting when strict, else a warning in the log and the default."""
    text = (os.environ if environ is None else environ).get(name)
    if text is None or not text.strip():
        return default
    try:
        value = kind(float(text)) if kind is int and float(text).is_integer() else kind(text)
    except (ValueError, OverflowError):
        value = None
    if value is None or not math.isfinite(value) or value < low:
        message = f"{name} must be a number of at least {low}, got {text!r}"
        if strict:
            raise SettingError(message)
        log.warning("%s; using %s", message, default)
        return default
    return value


@dataclass(frozen=True)
class LabSettings:
    """Server-wide limits of the training lab."""

    max_jobs: int = 2  # concurrent training jobs on the whole server
    max_steps: int = 3000  # per run
    max_seconds: float = 300.0  # per run; the run stops after it, keeping what it learned
    eval_examples: int = 200  # held-out examples per evaluation
    private: bool = False  # saved runs private to their session (a Space, or --public), else weights/NAME for all
    private_ttl_s: float = 3600.0  # a private run is deleted this long after it was saved

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, public: bool = False) -> LabSettings:
        """public: the server is shared (--public); on a Space (SPACE_ID set) it always is."""
        def read(name: str, kind, default, low):
            return env_number(name, default, low, kind, strict=True, environ=environ)

        space = bool((os.environ if environ is None else environ).get("SPACE_ID"))
        return cls(max_jobs=read("ATTN_LAB_JOBS", int, cls.max_jobs, 1),
                   max_steps=read("ATTN_LAB_MAX_STEPS", int, cls.max_steps, 1),
                   max_seconds=read("ATTN_LAB_MAX_SECONDS", float, cls.max_seconds, 1.0),
                   eval_examples=read("ATTN_LAB_EVAL_EXAMPLES", int, cls.eval_examples, 1),
                   private=public or space,
                   private_ttl_s=read("ATTN_PRIVATE_RUN_MINUTES", float, cls.private_ttl_s / 60, 1.0) * 60)


@dataclass(frozen=True)
class AppSettings:
    text_cap_bytes: int = DEFAULT_TEXT_BYTES
    kept_budget_bytes: int = 1_000_000_000
    sessions: int = 500
    max_attention_tokens: int = MAX_ATTENTION_TOKENS  # the Attention tab's cap, below the model's context
    device: str | None = None  # None: cuda (bfloat16) when there is a GPU, else cpu; "meta": no weights (Ray front)
    corpus_page_bytes: int = 20_000_000  # a shared server's saved corpus jobs, per page (0: none saved)
    corpus_max_seconds: float = 600.0  # one corpus job's time cap: 100 IOI pairs' head-site sweeps take ~250 s
    # a shared server fetches no model larger than this (MB in float32, the registry's memory_mb): a stranger's
    # choice must not pull gigabytes and evict the models in memory
    public_fetch_mb: float = 2000.0
    lab: LabSettings = field(default_factory=LabSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, public: bool = False, **given) -> AppSettings:
        """The settings the environment gives, then `given` (the command line's) on top. public: a shared server
        (--public): saved Lab runs stay private to their session, as on a Space."""
        read = dict(
            text_cap_bytes=int(env_number(TEXT_CAP_SETTING, 1.0, 0.001, environ=environ) * 1_000_000),
            kept_budget_bytes=int(env_number(KEPT_BUDGET_SETTING, 1000.0, 0.0, environ=environ) * 1_000_000),
            sessions=env_number(SESSIONS_SETTING, cls.sessions, 1, int, strict=True, environ=environ),
            corpus_page_bytes=int(env_number(CORPUS_PAGE_SETTING, cls.corpus_page_bytes / 1e6, 0.0, strict=True,
                                             environ=environ) * 1_000_000),
            corpus_max_seconds=env_number(CORPUS_SECONDS_SETTING, cls.corpus_max_seconds, 1.0, strict=True,
                                          environ=environ),
            public_fetch_mb=env_number(PUBLIC_FETCH_SETTING, cls.public_fetch_mb, 0.0, strict=True, environ=environ),
            lab=LabSettings.from_env(environ, public),
        )
        return cls(**{**read, **given})
