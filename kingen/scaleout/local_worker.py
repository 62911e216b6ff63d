"""Start-up of the worker processes of the local clusters kingen starts (a Dask preload).

Ctrl-C in a terminal reaches every process of its foreground group: the driver and the
worker processes of its local cluster. The driver stops the fit or batch and closes the
cluster, which ends the workers; a worker that took the signal itself died first, each
printing two tracebacks (about 70 lines for two workers). So the workers ignore it, and
leave out what the driver's going tells them: the tasks the closing cluster cancels (a
line per running task) and the results it no longer takes (a traceback per shard).
Workers that kingen did not start (``dask worker`` by hand, a batch system's jobs) keep
their own handling: this module is preloaded only by :func:`kingen.scaleout.cluster.
open_client` for ``local`` clusters.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

PRELOAD = __name__
"""The module name to give a cluster's ``preload`` (Dask imports it in each worker)."""


class _DriverGone(logging.Filter):
    """Drops, in a local cluster kingen started:

    - "Async instruction for <Task cancelled ...> ended with CancelledError": a task
      running as its worker closes, which happens only when kingen closes the cluster;
    - "failed during get data with ADDRESS -> None" with its traceback: a shard's scores
      sent straight to a driver that has stopped (a Ctrl-C mid-generation), the only
      reader of a worker's results there;
    - "Failed to communicate with scheduler during heartbeat" for "ConnectionPool
      closing" or "Stream is closed": a heartbeat cut short by the worker's own closing,
      or by the scheduler's (it lives in the driver's process: it closes only as the
      driver closes the cluster, or ends).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        to_a_client = message.startswith("failed during get data") and message.endswith(
            "-> None")  # a worker would be named
        closing = (message.startswith("Failed to communicate with scheduler during heartbeat")
                   and any(cut in str(record.exc_info and record.exc_info[1])
                           for cut in ("ConnectionPool closing", "Stream is closed")))
        return "ended with CancelledError" not in message and not to_a_client and not closing


def dask_setup(worker: Any) -> None:
    """Called by Dask as each worker starts, in its process's main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet = _DriverGone()
    for name in ("distributed.worker.state_machine", "distributed.worker"):
        logging.getLogger(name).addFilter(quiet)
