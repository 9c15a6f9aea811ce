"""What a corpus job streams to the page (OverUpdate) and how the core's refusals reach it (in words): shared by
the job run here (over.py), the job run in chunks elsewhere (chunked.py) and the other corpus jobs."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ui.services.checks import UserError


@dataclass
class OverUpdate:
    done: int
    total: int
    result: object           # dict[str, Over] | tuple[Over, Over] | Over: partial until finished
    seconds: float
    finished: bool = False
    saved: str = ""          # what saving the job did, in words (the finished update's)
    folder: Path | None = None   # the saved job's folder once finished (None: not saved, or stopped)
    capped: str = ""         # the finished update's words when the job stopped at its time cap, else empty


@contextmanager
def refusals_in_words():
    """The core's refusals of a corpus (ValueError, IndexError) as a UserError with the same words: a message
    that starts with a file's name keeps it as the file is named."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, IndexError) as error:
        text = str(error).strip() or "The corpus was refused"
        raise UserError(text if text.endswith((".", "?", "!")) else text + ".") from error


def partial_note(done: int, total: int, noun: str) -> str:
    return f"{done} of {total} {noun}s finished so far: the summary is of those"
