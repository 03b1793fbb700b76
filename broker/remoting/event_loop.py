"""The event loop every server and client of the project runs on: uvloop's (libuv, in C).

Why: the broker's network processes spend most of their CPU in the event loop and the transports'
system calls, not in our code (a pipelined send is a read, a parse, a forward over the store link
and a write). uvloop's loop and transports do that work in C. Measured on the send path (2 cores,
1 KiB sends, two pairs against the standard loop): the pipelined rate at saturation unchanged, a
paced 10,000 msg/s kept up instead of falling behind, the Python client's producers 11-19 % faster
and single in-flight round trips a little shorter (the README's broker figures).
Everything else in the project is plain asyncio and runs unchanged on either loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop event loop."""
    return uvloop.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop event loop (for a loop thread a synchronous facade drives)."""
    return uvloop.new_event_loop()


def stop_loop_thread(loop: asyncio.AbstractEventLoop, thread: threading.Thread, timeout_s: float = 10.0) -> None:
    """Stop a loop that ``thread`` runs (``run_forever``) and close it once the thread has ended.

    Closing matters: uvloop's loop keeps its epoll, eventfd and io_uring descriptors until closed
    (the garbage collector does not close it), five per loop."""
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout_s)
    if not thread.is_alive():
        loop.close()
