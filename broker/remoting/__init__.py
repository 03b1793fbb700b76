"""RocketMQ remoting protocol: frames, ``RemotingCommand``, codes, headers, bodies, TCP transport.

See ``/work/shared/reference/remoting-protocol.md`` for the wire facts these modules implement.
"""

from broker.remoting.codes import LanguageCode, PermName, PullSysFlag, RequestCode, ResponseCode
from broker.remoting.command import HeaderError, ProtocolError, RemotingCommand, ext_bool, ext_int, ext_str
from broker.remoting.frame import FrameDecoder, FrameError
from broker.remoting.transport import (
    Connection,
    ConnectionClosed,
    RemotingClient,
    RemotingConnectError,
    RemotingError,
    RemotingServer,
    RemotingTimeout,
    SyncRemotingClient,
    UnsupportedRequest,
)

__all__ = [
    "Connection", "ConnectionClosed", "FrameDecoder", "FrameError", "HeaderError", "LanguageCode", "PermName",
    "ProtocolError", "PullSysFlag", "RemotingClient", "RemotingCommand", "RemotingConnectError", "RemotingError",
    "RemotingServer", "RemotingTimeout", "RequestCode", "ResponseCode", "SyncRemotingClient", "UnsupportedRequest",
    "ext_bool", "ext_int", "ext_str",
]
