"""The network ↔ store link: one pickled list per loop turn, and one unpicklable message fails alone."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest

from broker.server.ipc import IpcClient, IpcServer, pack_each, pack_many, unpack_frames


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle Unpicklable")


def test_pack_many_is_one_frame_of_a_list():
    msgs = [("req", 1, "a"), ("req", 2, {"b": 1}), ("closed", 0, (7, 1))]
    frame = pack_many(msgs)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert pickle.loads(frame[4:]) == msgs
    buf = bytearray(frame + pack_many([("rep", 3, None)]) + frame[:5])
    got, used = unpack_frames(buf)
    assert got == msgs + [("rep", 3, None)]
    assert used == len(buf) - 5  # the partial frame stays


def test_pack_each_sends_the_good_messages_alone_when_one_is_unpicklable():
    refused = []
    data = pack_each([("req", 1, "a"), ("req", 2, Unpicklable()), ("req", 3, "c")],
                     lambda m, e: refused.append((m[1], type(e).__name__)))
    got, used = unpack_frames(bytearray(data))
    assert got == [("req", 1, "a"), ("req", 3, "c")]
    assert used == len(data)
    assert refused == [(2, "TypeError")]


def test_pack_each_sends_the_replacement():
    data = pack_each([("rep", 5, Unpicklable())], lambda m, e: ("rep", m[1], "instead"))
    assert unpack_frames(bytearray(data))[0] == [("rep", 5, "instead")]


def test_unpack_frames_refuses_a_huge_frame():
    with pytest.raises(ValueError):
        unpack_frames(bytearray(b"\xff\xff\xff\xff" + b"x" * 8))


def _serve(tmp_path, batches: list[list], frames: list[int]):
    def handle(payload):
        if payload == "bad-reply":
            return Unpicklable()
        return ("pool", payload)

    def handle_batch(payloads):
        batches.append(list(payloads))
        return [("stored", p) for p in payloads]

    server = IpcServer(str(tmp_path / "ipc.sock"), handle, lambda ch: None, workers=2,
                       lane=lambda p: isinstance(p, str) and p.startswith("send"), handle_batch=handle_batch)
    # frames the store side reads = pickle.loads calls on its I/O thread
    real_loads = pickle.loads

    def counting_loads(data, *a, **k):
        if threading.current_thread().name == "ipc-io":
            frames.append(1)
        return real_loads(data, *a, **k)

    return server, counting_loads


def test_round_trip_batches_a_turn_and_isolates_bad_requests(tmp_path, monkeypatch):
    batches: list[list] = []
    frames: list[int] = []
    server, counting_loads = _serve(tmp_path, batches, frames)
    import broker.server.ipc as ipc

    monkeypatch.setattr(ipc.pickle, "loads", counting_loads)
    server.start()
    try:
        async def main():
            client = IpcClient(server.path, lambda ev: None)
            await client.connect()
            await asyncio.sleep(0.05)
            frames.clear()
            results: dict[int, object] = {}
            done = asyncio.Event()

            def cb(i):
                def got(reply):
                    results[i] = reply
                    if len(results) == 11:
                        done.set()
                return got

            # all in one turn: one frame, except that the bad one makes the others go one by one
            for i in range(10):
                client.submit(f"send-{i}", cb(i))
            client.submit(Unpicklable(), cb(10))
            await done.wait()
            assert [results[i] for i in range(10)] == [("stored", f"send-{i}") for i in range(10)]
            assert isinstance(results[10], TypeError)
            assert sum(len(b) for b in batches) == 10

            # a good turn is one frame
            frames.clear()
            futs = [asyncio.ensure_future(client.call(f"send-x{i}")) for i in range(20)]
            assert await asyncio.gather(*futs) == [("stored", f"send-x{i}") for i in range(20)]
            assert len(frames) == 1
            assert await client.call("other") == ("pool", "other")
            # a reply that cannot be pickled answers with an error instead of leaving the caller waiting
            reply = await client.call("bad-reply")
            assert isinstance(reply, RuntimeError) and "not picklable" in str(reply)
            with pytest.raises(TypeError):
                await client.call(Unpicklable())
            await client.close()

        asyncio.run(main())
    finally:
        server.close()


def test_frames_larger_than_a_read_from_two_links_arrive_whole(tmp_path):
    """The I/O thread reads every link into one buffer of READ_CHUNK bytes: a frame several reads
    long, interleaved with another link's, must come out byte for byte."""
    import broker.server.ipc as ipc

    batches: list[list] = []
    server, _ = _serve(tmp_path, batches, [])
    server.start()
    big = [bytes([i]) * (ipc.READ_CHUNK * 2 + 12_345 * i) for i in range(1, 4)]
    try:
        async def main():
            clients = [IpcClient(server.path, lambda ev: None) for _ in range(2)]
            for client in clients:
                await client.connect()
            calls = [client.call(("big", n, payload)) for n, payload in enumerate(big) for client in clients]
            replies = await asyncio.gather(*calls)
            assert replies == [("pool", ("big", n, payload)) for n, payload in enumerate(big) for _ in clients]
            for client in clients:
                await client.close()

        asyncio.run(main())
    finally:
        server.close()
