"""Progress that stays readable wherever it is watched.

On a terminal, a live tqdm bar. Anywhere else (a KFP pod log, ``make demo > log``, a CI job) tqdm's carriage-return
redraws would pile up as one line per step, so the same bar becomes a plain log line at most every
``LOG_INTERVAL_S`` seconds, plus its first and last state. ``Ticker`` throttles per-step log lines the same way.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from tqdm.auto import tqdm

LOG_INTERVAL_S = 10.0


class _LogLines:
    """A file for tqdm that writes each redraw (``'\\r' + bar``) as one line on stderr, and drops the erasures."""

    def write(self, text: str) -> None:
        text = text.strip("\r\n ")
        if text:
            sys.stderr.write(text + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def interactive() -> bool:
    return sys.stderr.isatty()


def quiet_library_bars() -> None:
    """Off a terminal, turn off the bars of transformers and huggingface_hub (loading and saving weights): their
    redraws would pile up in the log. Entry points call this before those libraries load."""
    if interactive():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is imported
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def bar(iterable: Iterable | None = None, **kwargs) -> tqdm:
    """A tqdm bar that disappears when done on a terminal, else throttled log lines."""
    if interactive():
        return tqdm(iterable, leave=False, **kwargs)
    return tqdm(iterable, file=_LogLines(), mininterval=LOG_INTERVAL_S, ascii=True, leave=True, **kwargs)


class Ticker:
    """``ticker()`` is True on the first call and then at most once per ``interval_s``; ``ticker(last=True)`` is
    always True. Gates per-step log lines so a long loop logs a line every 10 s, not every step."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._next = -float("inf")

    def __call__(self, last: bool = False) -> bool:
        now = time.monotonic()
        if last or now >= self._next:
            self._next = now + self.interval_s
            return True
        return False
