"""Requests answered through a callback (``RemotingClient.invoke_soon``, ``Connection.request_soon``)
give what ``invoke`` gives: the response, or the same error types and texts."""

from __future__ import annotations

import asyncio

import pytest

from broker.remoting.command import RemotingCommand
from broker.remoting.transport import (
    ConnectionClosed,
    RemotingClient,
    RemotingConnectError,
    RemotingServer,
    RemotingTimeout,
)

ECHO, SILENT = 1001, 1002


async def _processor(cmd: RemotingCommand, conn) -> RemotingCommand | None:
    if cmd.code == SILENT:
        await asyncio.sleep(30)
    return cmd.response(0, remark=f"echo {cmd.ext_fields.get('n')}", body=cmd.body)


def _outcome_text(outcome) -> tuple:
    if isinstance(outcome, BaseException):
        return type(outcome).__name__, str(outcome)
    return outcome.code, outcome.remark, outcome.body


async def _soon(client: RemotingClient, addr: str, cmd: RemotingCommand, timeout: float = 3.0):
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    client.invoke_soon(addr, cmd, timeout, done.set_result)
    return await done


def test_invoke_soon_gives_what_invoke_gives():
    async def main() -> None:
        async with RemotingServer("127.0.0.1", 0, _processor) as server:
            async with RemotingClient() as client:
                # the first request connects (the task path), the next ones go through the callback path
                for n in range(5):
                    cmd = RemotingCommand.request(ECHO, {"n": str(n)}, b"body%d" % n)
                    got = await _soon(client, server.address, cmd)
                    assert _outcome_text(got) == (0, f"echo {n}", b"body%d" % n)
                    assert got.opaque == cmd.opaque
                many = [RemotingCommand.request(ECHO, {"n": str(n)}) for n in range(50)]
                replies = await asyncio.gather(*(_soon(client, server.address, c) for c in many))
                assert [r.remark for r in replies] == [f"echo {n}" for n in range(50)]

                late = RemotingCommand.request(SILENT, {})
                direct = RemotingCommand.request(SILENT, {})
                got = await _soon(client, server.address, late, timeout=0.2)
                with pytest.raises(RemotingTimeout) as err:
                    await client.invoke(direct, 0.2, addr=server.address)
                assert type(got) is RemotingTimeout
                assert str(got) == str(err.value).replace(f"opaque={direct.opaque}", f"opaque={late.opaque}")

                pending = asyncio.ensure_future(_soon(client, server.address, RemotingCommand.request(SILENT, {})))
                await asyncio.sleep(0.1)
                for conn in list(client._connections.values()):
                    conn.close()
                got = await pending
                assert type(got) is ConnectionClosed and "closed" in str(got)

    asyncio.run(main())


def test_invoke_soon_reports_connect_errors():
    async def main() -> None:
        async with RemotingClient(connect_timeout=1.0) as client:
            got = await _soon(client, "127.0.0.1:1", RemotingCommand.request(ECHO, {}))
            assert type(got) is RemotingConnectError
            got = await _soon(client, None, RemotingCommand.request(ECHO, {}))
            assert type(got) is RemotingConnectError and "no address" in str(got)

    asyncio.run(main())
