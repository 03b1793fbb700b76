"""What crosses the link between a network process and the store process: a decoded request and
its reply (:mod:`broker.server.ipc` pickles them).

They live apart from the request processors so that a network process, which unpickles every
``Reply``, never imports the storage engine (and numba) just to name the class.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from broker.remoting.codes import RequestCode, ResponseCode
from broker.server.clients import Notify

# the sends: forwarded without a task per request, and stored in groups by the store process
SEND_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})


@dataclass
class Request:
    code: int
    ext: dict[str, str]
    body: bytes = b""
    channel: object = None  # opaque id of the client connection (handler id, connection number)
    peer: str = ""  # "ip:port" of the client
    language: str = ""
    version: int = 0
    resumed: bool = False  # a parked pull asked again: do not park it a second time

    def __reduce__(self):
        # crosses the process link once per message: a tuple pickles in half the time of a dataclass
        return Request, (self.code, self.ext, self.body, self.channel, self.peer, self.language, self.version,
                         self.resumed)


@dataclass
class Reply:
    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    suspend: tuple[str, int, int, int] | None = None  # (topic, queue id, offset, timeout ms) to park
    notify: list[Notify] = field(default_factory=list)  # NOTIFY_CONSUMER_IDS_CHANGED to send
    deferred: Future | None = None  # the real reply comes later (a client's answer): a Future of a Reply

    def __reduce__(self):
        # crosses the process link once per message; a deferred reply never does (it is a Future)
        if self.deferred is not None:
            raise TypeError("a deferred Reply cannot leave its process")
        if self.notify:
            return Reply, (self.code, self.remark, self.ext, self.body, self.suspend, self.notify)
        return Reply, (self.code, self.remark, self.ext, self.body, self.suspend)
