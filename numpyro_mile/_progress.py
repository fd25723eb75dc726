"""Progress bars that read well on a terminal and in a log.

On a terminal (or in a notebook) a bar redraws in place as tqdm does; written to anything else (a file, a pipe:
a CI log, a cluster job's output) every redraw stays in the log as a line of its own, so there the bar redraws
only at its start, after each fifth of its total and at its end. NumPyro's own bar (``MCMC(..., progress_bar=True)``)
is NumPyro's: in a log, pass ``progress_bar=False`` or run through :func:`numpyro_mile.run_chunked`, whose bar is
this one; tqdm also reads ``TQDM_MININTERVAL`` (seconds between redraws) from the environment.
"""

from __future__ import annotations

import sys
from typing import IO

from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as _chosen
from tqdm.std import tqdm as _console

__all__ = ["LOG_REDRAWS", "progress_bar"]

#: redraws between the first and the last of a bar written to a log
LOG_REDRAWS = 5


def _interactive(stream: IO) -> bool:
    """Whether a bar on ``stream`` redraws in place: a terminal, or tqdm's notebook widget."""
    if _chosen is not _console:  # tqdm.auto chose the notebook widget
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(
    total: int, *, desc: str | None = None, initial: int = 0, disable: bool = False, leave: bool = True, file=None
) -> tqdm:
    """A tqdm bar over ``total`` units (steps, epochs) on ``file`` (default stderr): tqdm's usual bar where it
    redraws in place, otherwise one that redraws :data:`LOG_REDRAWS` times over its total (whatever the time
    it takes) plus its first and last line."""
    stream = sys.stderr if file is None else file
    if disable or _interactive(stream):
        return tqdm(total=total, desc=desc, initial=initial, disable=disable, leave=leave, file=file)
    return tqdm(
        total=total,
        desc=desc,
        initial=initial,
        leave=leave,
        file=stream,
        miniters=max(1, total // LOG_REDRAWS),
        mininterval=0.0,
        maxinterval=float("inf"),  # no timed redraw by tqdm's monitor thread
    )
