"""Running Apache's C++ RocketMQ client (the ``rocketmq`` wheel) from tests: each script of
``tests/cpp_client_scripts/`` in its own process, plus small admin helpers against our broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.transport import SyncRemotingClient
from tests.broker_harness import REPO
from tests.cpp_client_scripts._common import SHUTDOWN_MARKER

SCRIPTS = Path(__file__).resolve().parent / "cpp_client_scripts"
# librocketmq 1.2.3 sometimes aborts in shutdown(): a worker thread meets boost's interruption
# outside a handler (known upstream: apache/rocketmq-client-cpp#204, "sometimes shutdown will coredump")
_SHUTDOWN_ABORT = "boost::thread_interrupted"


class ClientProcess:
    """One C++-client script in its own process (own HOME so librocketmq logs land in the tmp dir)."""

    def __init__(self, name: str, tmp: Path, args: list[str], timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        home = tmp / f"home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        self.stdout_path = tmp / f"{name}.stdout"
        self.stderr_path = tmp / f"{name}.stderr"
        env = dict(os.environ, HOME=str(home), PYTHONPATH=str(SCRIPTS))
        self._out = open(self.stdout_path, "w")
        self._err = open(self.stderr_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, str(SCRIPTS / args[0]), *args[1:]], cwd=REPO, env=env,
                                     stdout=self._out, stderr=self._err, start_new_session=True)

    def wait_line(self, prefix: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith(prefix) for line in self.stdout_path.read_text().splitlines()):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no {prefix!r} line within {timeout} s\n{self._tails()}")

    def _tails(self) -> str:
        return (f"--- {self.name} stdout (tail) ---\n{self.stdout_path.read_text()[-2000:]}\n"
                f"--- {self.name} stderr (tail) ---\n{self.stderr_path.read_text()[-3000:]}")

    def result(self) -> dict:
        """Wait for the script (bounded) and return its JSON; a crash or hang fails with its output."""
        remaining = max(1.0, self.timeout - (time.monotonic() - self.started))
        try:
            self.proc.wait(remaining)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish within {self.timeout:.0f} s\n{self._tails()}")
        finally:
            self._out.close()
            self._err.close()
        if self.proc.returncode != 0 and not self._shutdown_abort():
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}\n{self._tails()}")
        lines = [ln for ln in self.stdout_path.read_text().splitlines() if ln.startswith("{")]
        if not lines:
            raise AssertionError(f"{self.name} printed no JSON result\n{self._tails()}")
        return json.loads(lines[-1])

    def _shutdown_abort(self) -> bool:
        """The C++ client's own shutdown race, after the script reported everything: its result
        line, then the marker, then the abort naming boost's interruption. Anything else (an abort
        before the result, another signal, another message) is a failure."""
        out = self.stdout_path.read_text().splitlines()
        if (self.proc.returncode == -signal.SIGABRT and out and out[-1] == SHUTDOWN_MARKER
                and len(out) > 1 and out[-2].startswith("{") and _SHUTDOWN_ABORT in self.stderr_path.read_text()):
            print(f"{self.name}: the C++ client aborted in shutdown() after its result "
                  f"({_SHUTDOWN_ABORT}); result kept", file=sys.stderr)
            return True
        return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


class ClientProcesses:
    """The C++-client processes a test module starts (logs under ``tmp``), killed together at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ClientProcess] = []

    def client(self, name: str, args: list[str], timeout: float) -> ClientProcess:
        c = ClientProcess(name, self.tmp, args, timeout)
        self.started.append(c)
        return c

    def kill_all(self) -> None:
        for c in self.started:
            c.kill()


def admin(addr: str, code: int, ext: dict, body: bytes = b"") -> RemotingCommand:
    with SyncRemotingClient(addr) as client:
        return client.invoke(RemotingCommand.request(code, ext, body), timeout=10)


def wait_for(what: str, predicate, timeout: float, interval: float = 0.2, detail=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}. {detail()}")
        time.sleep(interval)


def max_offset(broker_addr: str, topic: str, queue_id: int) -> int:
    resp = admin(broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    assert resp.code == ResponseCode.SUCCESS, resp
    return int(resp.ext_fields["offset"])


def create_routed_topic(broker_addr: str, namesrv: str, topic: str, queues: int) -> None:
    """UPDATE_AND_CREATE_TOPIC, then wait until the name server routes it (clients that start later
    find it at once instead of at their next 30 s route refresh)."""
    resp = admin(broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                 {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
                  "perm": 6, "topicFilterType": "SINGLE_TAG"})
    assert resp.code == ResponseCode.SUCCESS, resp

    def routed():
        r = admin(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        return r.code == ResponseCode.SUCCESS and r.body

    wait_for(f"a route for {topic} on the name server", routed, 30)
