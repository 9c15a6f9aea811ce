"""Progress reports: `progress(fraction, message)` callbacks, and tqdm's bar for the terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable

from tqdm import tqdm

Progress = Callable[[float, str], None]


def no_progress(fraction: float, message: str) -> None:
    pass


def span(progress: Progress, start: float, end: float) -> Progress:
    """A progress callback for one stage that fills [start, end] of the caller's bar."""

    def report(fraction: float, message: str) -> None:
        progress(start + (end - start) * min(max(fraction, 0.0), 1.0), message)

    return report


class TerminalProgress:
    """A Progress drawn by tqdm on stderr, from its first report on; call close() when the pull ends."""

    def __init__(self, file=None):
        self.file = file or sys.stderr
        self.bar = None  # an installed model reports nothing, and then no bar is drawn

    def __call__(self, fraction: float, message: str) -> None:
        if self.bar is None:
            self.bar = tqdm(
                total=1.0,
                file=self.file,
                bar_format="{percentage:3.0f}%|{bar:30}| {elapsed} {desc}",
                mininterval=0.1 if self.file.isatty() else 5.0,  # in a log, a line every few seconds
            )
        self.bar.set_description_str(message, refresh=False)
        self.bar.update(min(max(fraction, 0.0), 1.0) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
