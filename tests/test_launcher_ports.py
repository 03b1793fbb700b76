"""The loopback ports test servers are started on: picked where no outgoing connection can take them
between the pick and the server's bind (a clean-clone run lost the Spark master's port that way)."""

from __future__ import annotations

import socket

from broker.server import launcher


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    low, _ = launcher._ephemeral_range()
    ports = {launcher.free_port() for _ in range(50)}
    assert all(launcher.LOWEST_PICKED_PORT <= port < low for port in ports)
    assert len(ports) > 1  # random picks, not one fixed port that parallel starters would share
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_skips_a_taken_port(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        free = []  # ports free a moment ago (a neighbour of ``busy`` may be any connection's: not one)
        for _ in range(20):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                free.append(probe.getsockname()[1])
        picks = iter([busy, busy, *free])

        class Fixed:
            def randrange(self, start, stop):
                return next(picks)

        monkeypatch.setattr(launcher.random, "SystemRandom", Fixed)
        monkeypatch.setattr(launcher, "_ephemeral_range", lambda: (65535, 65535))
        monkeypatch.setattr(launcher, "LOWEST_PICKED_PORT", 1024)
        port = launcher.free_port()
        assert port != busy and port in free


def test_ephemeral_range_falls_back_to_linux_default(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert launcher._ephemeral_range() == (32768, 60999)
    bad = tmp_path / "range"
    bad.write_text("not numbers\n")
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE_FILE", bad)
    assert launcher._ephemeral_range() == (32768, 60999)
