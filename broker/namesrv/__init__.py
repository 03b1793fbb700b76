"""RocketMQ name server: routing state (``route_table``) and the asyncio server (``server``)."""

from broker.namesrv.route_table import BrokerLiveInfo, RegisterResult, RouteTable
from broker.namesrv.server import NameServer, run_name_server, serve_name_server

__all__ = ["BrokerLiveInfo", "NameServer", "RegisterResult", "RouteTable", "run_name_server", "serve_name_server"]
