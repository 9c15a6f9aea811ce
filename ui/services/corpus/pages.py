"""Where the Across texts tab saves a page's corpus jobs (core/corpus/saved.py), and what it says about it.

On a laptop every page shares one runs folder, saved.default_root() read at each job ($ATTN_RUNS_DIR, a Space's
/data/runs, else runs/), holding at most RUNS_MAX_BYTES.

On a shared server (a Space, or --public) each page (its Gradio session) saves under a folder of its own,
ROOT/.private/TOKEN/, through the Lab's PrivateRuns (TOKEN random, not the session's id; ROOT as on a laptop): a
job is reopened and resumed by its page alone, and another page that asks for the same corpus measures it afresh,
never reading these items (an upload's items included). A page's jobs take at most page_bytes, all pages' together
RUNS_MAX_BYTES; a new job past either cap is measured and shown but not saved, its note saying why. Each job's
folder is deleted ttl_s after its last write (a job starting or resuming, an item finished, the result saved) or
after the end of its page's last job, whichever is later (never while a job of its page runs), by PrivateRuns's
expiry thread, which sleeps until the next one is due, so an idle server keeps nothing longer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from core.corpus import saved
from ui.services.lab.private import PrivateRuns
from ui.settings import CORPUS_PAGE_SETTING

RUNS_MAX_BYTES = 1_000_000_000   # the runs folder (a laptop's), or every page's private jobs together
NOT_SAVED = "Not saved: this job has no runs folder, so it is measured afresh each time."


def minutes(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 60 else f"{seconds:g} seconds"


@dataclass
class Saving:
    """Where one page's job is saved (root None: it is not, and `why` says why), in words for its note."""
    root: Path | None
    why: str = NOT_SAVED
    where: str = "in the runs folder; a rerun of the same job reopens it"
    room: Callable[[int], None] | None = None  # room(0): may a new job start; room(size): may size more bytes be
    # written (saved.room_for); raises saved.NoRoom when not
    wrote: Callable[[Path], None] | None = None  # told each time a job's folder is written
    max_bytes: int | None = None               # the root's cap (a laptop's); a page's are room's
    held: Callable[[], AbstractContextManager] = nullcontext  # around a job: its page's jobs are not deleted meanwhile


def shared_saving(root: Path) -> Saving:
    """A laptop's: the one runs folder, capped at RUNS_MAX_BYTES."""
    return Saving(root, max_bytes=RUNS_MAX_BYTES)


def mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


class CorpusRuns:
    """Each page's place for saved corpus jobs; one object per server (ui.services.Services.corpus_runs)."""

    def __init__(self, private: bool, ttl_s: float, page_bytes: int, total_bytes: int = RUNS_MAX_BYTES):
        if page_bytes < 0 or total_bytes < 0 or ttl_s <= 0:
            raise ValueError(f"the caps are bytes, 0 or more, and the lifetime seconds, more than 0; got "
                             f"page_bytes={page_bytes}, total_bytes={total_bytes}, ttl_s={ttl_s}")
        self.private, self.ttl_s, self.page_bytes, self.total_bytes = private, ttl_s, page_bytes, total_bytes
        self._pages: PrivateRuns | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings) -> CorpusRuns:
        """settings: ui.settings.AppSettings (its lab's `private` and `private_ttl_s`, its corpus_page_bytes)."""
        return cls(settings.lab.private, settings.lab.private_ttl_s, settings.corpus_page_bytes)

    def pages(self) -> PrivateRuns:
        """The pages' private folders, made at the first job under the runs folder of that time. What an earlier
        process left there is deleted first: its pages are gone, so no page reaches it now."""
        with self._lock:
            if self._pages is None:
                self._pages = PrivateRuns(saved.default_root(), self.ttl_s)
                self._pages.clear()
            return self._pages

    def saving(self, page: str | None) -> Saving:
        """Where `page` (a session's key) saves its next job now: one Saving a job, whose room() counts what that
        job writes."""
        if not self.private:
            return shared_saving(saved.default_root())
        pages, page = self.pages(), str(page)
        root = pages.folder(page, "job").parent      # ROOT/.private/TOKEN: this page's alone
        life = minutes(pages.ttl_s)

        used: list[int] = []    # [this page's bytes, every page's]: read once a job, counted up as it writes

        def room(size: int = 0) -> None:
            if not used:
                used.extend((saved.disk_usage(root), saved.disk_usage(pages.root)))
            page, every = used[0] + size, used[1] + size
            if page > self.page_bytes or (not size and page >= self.page_bytes):
                taken = (f"this page's saved jobs take {mb(used[0])}" if not size else
                         f"the next {mb(size)} would take this page's saved jobs to {mb(page)}")
                raise saved.NoRoom(f"{taken}, {'at or ' if not size else ''}over a page's cap of "
                                   f"{mb(self.page_bytes)} ({CORPUS_PAGE_SETTING}); each is deleted {life} after "
                                   "its last write, and then this page saves again")
            if every > self.total_bytes or (not size and every >= self.total_bytes):
                raise saved.NoRoom(f"the pages' saved jobs take {mb(every)} together, at or over this server's cap "
                                   f"of {mb(self.total_bytes)}; each is deleted {life} after its last write")
            used[:] = [page, every]

        def wrote(folder: Path) -> None:
            pages.add(page, folder.name, folder)    # (re)starts the job's clock: deleted ttl_s from now

        return Saving(root, where=f"for this page only, deleted {life} after its last write; a rerun of the same "
                                  "job on this page reopens it", room=room, wrote=wrote,
                      held=lambda: pages.held(page))


def saving_of(services, page: str | None) -> Saving:
    """The page's Saving from the server's CorpusRuns; services built without one (a test's) save as a laptop
    does, or, on a shared server, not at all."""
    runs = getattr(services, "corpus_runs", None)
    if runs is not None:
        return runs.saving(page)
    if services.settings.lab.private:
        return Saving(None, "Not saved: this server keeps no private folder for corpus jobs.")
    return shared_saving(saved.default_root())


def saved_words(run, saving: Saving) -> str:
    """What saving did, in one sentence (empty while a job runs)."""
    if saving.root is None:
        return saving.why
    if run is None:
        return ""
    where = run.folder.name.rpartition("__")[2]   # the job's key: the folder's name holds the model's, maybe a path
    if run.finished and not run.measured:
        return f"Reopened from the saved job {where}: nothing was measured again."
    resumed = f", resumed from {run.reused} items saved before" if run.reused else ""
    if getattr(run, "full", ""):
        return (f"Job {where} stopped saving{resumed}: {run.full}. Past the cap the job is measured and shown, not "
                f"saved; the items written before are kept ({saving.where}).")
    state = "saved" if run.finished else "stopped; its finished items are kept, and the same job resumes from them"
    return f"Job {where} {state}{resumed} ({saving.where})."


def saving_given(root: Path | None, saving: Saving | None) -> Saving:
    """stream_over's Saving: the one given, else the runs folder `root` (None: not saved)."""
    if saving is not None:
        return saving
    return Saving(None) if root is None else shared_saving(Path(root))


def unsaved(room_error: Exception) -> Saving:
    """A job past a cap: measured and shown, not saved; the refusal is its note's reason."""
    return Saving(None, f"Not saved: {room_error}.")
