"""Run external commands with one error type that carries their stderr."""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Sequence

from scalelab.core.errors import CommandError

log = logging.getLogger(__name__)


def run(cmd: Sequence[str], *, input: str | None = None, check: bool = True,
        timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run a command, capture its output, raise CommandError (with stderr) if it fails."""
    log.debug("run: %s", shlex.join(cmd))
    try:
        proc = subprocess.run(list(cmd), input=input, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise CommandError(f"{cmd[0]} not found; install it (see docs/targets.md, or run ./bootstrap.sh)") from None
    except subprocess.TimeoutExpired:
        raise CommandError(f"{shlex.join(cmd)} did not finish in {timeout:g} s") from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        raise CommandError(f"{shlex.join(cmd)} failed: {err.splitlines()[-1] if err else proc.returncode}",
                           stderr=proc.stderr)
    return proc
