"""Ctrl-C while a local cluster starts: held back, and delivered once the cluster is up.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator


def in_main_thread() -> bool:
    """True in the interpreter's main thread (the one signal handlers run in)."""
    return threading.current_thread() is threading.main_thread()


HOLD_S = 15.0


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold back a Ctrl-C while a local cluster starts, and deliver it once it is up.

    Ctrl-C reaches the worker processes as well as the driver. A worker that takes it
    while its interpreter starts, before kingen's preload ignores it, dies with a "Fatal
    Python error" and two tracebacks; a driver that takes it inside Dask's start-up leaves
    a half-started cluster that Dask's exit hook then fails to close, with a traceback.
    So the signal is blocked in the driver's main thread, and so in the threads Dask starts
    from it and in the worker processes they spawn, which inherit the blocked signal. A
    press is noted (a thread of kingen's own, not blocking the signal, takes it from the
    system; the main thread runs the handler when Dask's wait for the start ends, or every
    10 s) and raised as :class:`KeyboardInterrupt` on leaving, with a cluster to close.
    A start still running :data:`HOLD_S` seconds on is stopped by a press: one made
    before then at the first of those 10 s marks past :data:`HOLD_S`, a later one at the
    next mark.
    """
    if not (hasattr(signal, "pthread_sigmask") and in_main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        # Windows; a library caller's thread, or its own handler; Ctrl-C ignored (nohup)
        yield
        return
    import _thread
    import multiprocessing.resource_tracker

    # Its first start unblocks every signal in the thread that starts it (Dask's event
    # loop, as the first worker is spawned); started now, it is left running as is. It
    # takes this interpreter's warning options: a worker process ended mid-start (a press
    # that stops a start) leaves a semaphore it cleans up, saying so in two warnings.
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet not in sys.warnoptions:
        sys.warnoptions.append(quiet)
    multiprocessing.resource_tracker.ensure_running()
    t0 = time.monotonic()
    presses: list[int] = []
    lock, left = threading.Lock(), threading.Event()

    def note(number: int, frame: object) -> None:
        presses.append(number)
        if time.monotonic() - t0 >= HOLD_S:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt

    def take() -> None:
        # The thread the system hands a press to, as long as the hold lasts (the main
        # thread blocks the signal, and Dask's threads inherit that). At HOLD_S, a press
        # noted early is handed to the main thread again.
        if not left.wait(HOLD_S):
            with lock:
                if not left.is_set() and presses:
                    _thread.interrupt_main()
            left.wait()

    threading.Thread(target=take, name="kingen-ctrl-c", daemon=True).start()
    signal.signal(signal.SIGINT, note)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one held back is noted now
        with lock:
            left.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if presses:
            raise KeyboardInterrupt
