"""Logging filters that keep what Dask logs (tracebacks of refused submissions, a client's
shutdown, a lost worker, a cluster closed or a start abandoned) out of kingen's one-line
messages; ``kingen -v`` keeps most of it.
"""

from __future__ import annotations

import logging


class RefusedSubmissions(logging.Filter):
    """Drops the event loop's tracebacks of a refused job submission, keeping what the
    batch system said (``said``): :func:`submit_jobs` reports it in one line instead."""

    def __init__(self) -> None:
        super().__init__()
        self.said = ""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = f"{record.getMessage()} {exc or ''}"
        if "Command exited with non-zero exit code" not in text:
            return True
        lines = [line.strip() for line in str(exc or text).split("stderr:", 1)[-1]
                 .splitlines() if line.strip()]
        self.said = lines[0] if lines else ""
        # kingen -v keeps the whole traceback (the command, its exit code and output)
        return logging.getLogger().getEffectiveLevel() <= logging.INFO


REFUSED = RefusedSubmissions()


class ShutdownNoise(logging.Filter):
    """Drops what Dask logs when a client stops waiting, each record with its traceback:

    - asyncio's "Task exception was never retrieved" for ``AllExit``, the exception Dask's
      ``gather`` uses to stop waiting (one per shard when Ctrl-C stops a gather);
    - a ``CancelledError`` of the client's own tasks as it closes (its reconnection to a
      lost scheduler, say);
    - "Failed to reconnect to scheduler": the fit or batch then stops with its own line,
      which says so;
    - the event loop's "Exception in callback" for Dask's ``sync.<locals>.cancel`` failing
      with a ``NameError``: Ctrl-C pressed in the first moment of a call into Dask, before
      the call had a task to cancel (a flaw of Dask's ``sync``; nothing was running).

    ``kingen -v`` keeps the middle two."""

    def filter(self, record: logging.LogRecord) -> bool:
        import asyncio

        exc = record.exc_info[1] if record.exc_info else None
        if type(exc).__name__ == "AllExit":
            return False
        if isinstance(exc, NameError) and "sync.<locals>.cancel" in record.getMessage():
            return False
        noise = (isinstance(exc, asyncio.CancelledError)
                 or "Failed to reconnect to scheduler" in record.getMessage())
        return not noise or logging.getLogger().getEffectiveLevel() <= logging.INFO


SHUTDOWN_NOISE = ShutdownNoise()
# where it is logged: asyncio's tasks, Dask's client and utilities, tornado's event loop
SHUTDOWN_LOGGERS = ("asyncio", "distributed.client", "distributed.utils", "tornado.application")


def quiet_shutdown() -> None:
    """Put :data:`SHUTDOWN_NOISE` on the loggers that log it (once: filters are a set)."""
    for name in SHUTDOWN_LOGGERS:
        logging.getLogger(name).addFilter(SHUTDOWN_NOISE)


class LostWorkerNoise(logging.Filter):
    """Drops what a local cluster's scheduler and nannies log when a worker process dies
    (its restart, the tasks it held, ran again elsewhere): the fit says it in its own line
    and records it in the run file. ``kingen -v`` keeps them."""

    SAYINGS = ("Restarting worker", "workers died while", "caused the cluster to lose "
               "already computed", "was killed by signal", "was killed by unknown signal")

    def filter(self, record: logging.LogRecord) -> bool:
        return (not any(text in record.getMessage() for text in self.SAYINGS)
                or logging.getLogger().getEffectiveLevel() <= logging.INFO)


LOST_WORKER_NOISE = LostWorkerNoise()


class KilledOnClose(logging.Filter):
    """Drops the nanny's "Worker process still alive after 4.0 seconds, killing" while
    kingen closes its own local cluster: a worker still running a fit (a batch stopped by
    Ctrl-C or by an error) is ended so, as intended; its run file is safe at any moment.
    Drops too the scheduler's "broadcast to ADDRESS failed" for a worker so ended: a fit
    stopped by Ctrl-C while its workers dropped its solver (a second press cuts that wait
    short) leaves the drop on its way to a worker busy with a shard. ``kingen -v`` keeps
    the lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        ended = "still alive after" in message or (message.startswith("broadcast to ")
                                                   and " failed: " in message)
        return not ended or logging.getLogger().getEffectiveLevel() <= logging.INFO


class AbandonedStarts(logging.Filter):
    """Drops, once ``kingen.scaleout.cluster`` has ended a start: asyncio's "Task exception was
    never retrieved" for a nanny's cancelled start ("Nanny failed to start"), and Dask's
    warning that a worker process's "exit status was already read" (kingen reaped it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not ((isinstance(exc, RuntimeError) and str(exc).startswith("Nanny failed"))
                    or "exit status was already read" in record.getMessage())


ABANDONED = AbandonedStarts()
