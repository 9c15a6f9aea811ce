"""The services: plain Python between the page and the core, one concern a module; none imports gradio.

`Services` is the app's state, built once (app.main, or a test) and handed to the page: the settings, the
loaded models, what sessions keep for reuse, the training lab, the long jobs running now, the
cheap tabs' first screens and the course's lessons. Nothing is created
at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GENERATION_SLOTS = 2

from ui.services.corpus.pages import CorpusRuns
from ui.services.jobs import HeavyJobs, Turns
from ui.services.kept import FirstViews, KeptStore
from ui.services.lab.runs import Lab
from ui.services.learn.course import LessonCache
from ui.services.models import ModelStore
from ui.settings import AppSettings


@dataclass
class Services:
    settings: AppSettings
    models: ModelStore
    kept: KeptStore
    lab: Lab
    heavy: HeavyJobs = field(default_factory=HeavyJobs)
    first_views: FirstViews = field(default_factory=FirstViews)
    lessons: LessonCache = field(default_factory=LessonCache)  # the Learn tab's, apart from the first screens'
    # generation steps: two tokens computed at once (the old limit of two generations), every stream in turn
    turns: Turns = field(default_factory=lambda: Turns(GENERATION_SLOTS))
    corpus_runs: CorpusRuns | None = None  # where each page saves its corpus jobs (private on a shared server)

    @classmethod
    def create(cls, settings: AppSettings | None = None, models: ModelStore | None = None,
               default_model: str | None = None) -> Services:
        """The services for these settings (the defaults when None): a model store that lists `default_model`
        (a folder, say) beside the registry's names, an empty kept store within the budget, and the lab."""
        settings = settings or AppSettings()
        if models is None:
            models = ModelStore(extra_names=[default_model] if default_model else [], device=settings.device)
        lab = Lab(settings.lab)
        if lab.private is not None:
            models.public = True  # a shared server: only the picker's names load (ModelStore.key)
            models.max_fetch_mb = settings.public_fetch_mb  # and a choice fetches no model larger than this
            models.private = lab.private_folder  # a session's saved run loads by its alias, listed to it alone
            lab.private.on_expire.append(models.forget)  # and once expired, answers why instead of loading
        return cls(settings, models, KeptStore(settings.kept_budget_bytes), lab,
                   corpus_runs=CorpusRuns.from_settings(settings))
