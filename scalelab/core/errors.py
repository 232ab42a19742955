"""Domain errors. Library code raises these; tasks.py turns them into one clear line."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


class ScalelabError(Exception):
    """Base of every error scalelab reports to the user as one line."""


class InputError(ScalelabError):
    """A value given by the user is malformed or out of range."""


class NotRootError(ScalelabError):
    """The operation needs root privileges."""


class ClusterError(ScalelabError):
    """A cluster could not be created, changed, found or destroyed."""


class ProvisionError(ClusterError):
    """A provisioning step failed; everything it created was removed."""


class CommandError(ScalelabError):
    """An external command failed; carries its stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


def suggest(word: str, options: Sequence[str]) -> str:
    """'did you mean ...?' for the closest options (ties all named), or "" if none is close.

    >>> suggest("batchsize", ["nodes", "batch_size"]), suggest("resnet51", ["resnet50", "resnet56"])
    ("did you mean 'batch_size'?", "did you mean 'resnet50' or 'resnet56'?")
    """
    scores = {o: difflib.SequenceMatcher(None, word, o).ratio() for o in options}
    best = max(scores.values(), default=0.0)
    if best < 0.6:
        return ""
    close = [repr(o) for o in options if scores[o] == best]
    return f"did you mean {' or '.join(close)}?"


class ReportError(ScalelabError):
    """A sweep's results cannot be found, read or reported."""
