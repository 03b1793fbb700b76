"""The broker's light processes stay light: the supervisor and the network processes are spawned
interpreters, and importing the storage engine there (numba kernels, pyarrow) cost every broker
start seconds of CPU per process for code those processes never run."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

from broker.server.clients import Notify
from broker.server.request_reply import Reply, Request

HEAVY = ("numba", "pyarrow", "broker.engine.message_store", "broker.engine.dispatch", "broker.server.processors",
         "broker.store.record_scan", "broker.store.dispatch_fields")


def _loaded_after(code: str) -> list[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in json.loads(out) if m.split(".")[0] in HEAVY or m in HEAVY]


def test_network_process_and_supervisor_import_no_storage_engine():
    assert _loaded_after("import broker.server.network_process, broker.server.supervisor") == []


def test_what_crosses_the_link_unpickles_without_the_request_layer():
    frames = pickle.dumps([Request(10, {"topic": "T"}, b"body", (1, 2), "127.0.0.1:1", "JAVA", 373),
                           Reply(0, None, {"msgId": "X"}, b"", None, [Notify("G", ((1, 2),))])])
    code = f"import pickle\nitems = pickle.loads({frames!r})\nassert items[1].notify[0].group == 'G'"
    assert _loaded_after(code) == []


def test_package_exports_resolve_on_first_use():
    import broker.engine
    import broker.server

    assert broker.server.BrokerMetadata.__module__ == "broker.server.metadata"
    assert broker.engine.MessageStore.__module__ == "broker.engine.message_store"
    assert broker.engine.SYNC_FLUSH == "SYNC_FLUSH"
    try:
        broker.server.NoSuchThing
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
