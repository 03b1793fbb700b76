"""The ACL as a server runs it: the rules of one ``plain_acl.yml``, reloaded when the file changes,
checked before a request goes anywhere, and the answer a refused request gets.

Apache 4.9 runs the validator as an RPC hook before the request's processor; the AclException it
throws becomes a SYSTEM_ERROR response whose remark is ``RemotingHelper.exceptionSimpleDesc`` (the
exception and its first stack frame). A refused oneway request gets no answer.

Reloading follows Apache's FileWatchService: the file's mtime and size are looked at about once a
second (by :meth:`AclGate.watch`, and when a request is checked); a changed file is loaded anew, and one that fails to load leaves
the last good rules in force (the error is logged once per change).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from broker.acl.config import AclRules, load_rules
from broker.acl.errors import AclConfigError, AclDenied
from broker.acl.permission import ADMIN_CODES
from broker.acl.remote_address import host_of
from broker.acl.signature import ACCESS_KEY
from broker.acl.validator import AccessRequest, validate
from broker.remoting.codes import ResponseCode, request_code_name

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
DENIED_CODE = ResponseCode.SYSTEM_ERROR  # what Apache 4.9's remoting layer answers an AclException with


class AclGate:
    """Rules from ``path``, kept fresh; :meth:`check` says whether a request may pass."""

    def __init__(self, path: str | os.PathLike, admin_codes: frozenset[int] = ADMIN_CODES, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.admin_codes = admin_codes
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self.rules: AclRules = load_rules(self.path)  # a broken file at start-up is the caller's error
        self._next_poll = clock() + POLL_INTERVAL_S
        log.info("ACL rules loaded from %s: %d account(s), %d global whitelist pattern(s)", self.path,
                 len(self.rules.accounts), len(self.rules.global_white))

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def maybe_reload(self) -> None:
        """Reload if the file changed since the last look (looks at most once per POLL_INTERVAL_S)."""
        now = self._clock()
        if now < self._next_poll:
            return
        with self._lock:
            if now < self._next_poll:
                return
            self._next_poll = now + POLL_INTERVAL_S
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self.rules = load_rules(self.path)
            except AclConfigError as exc:
                log.error("ACL file changed but cannot be used; the previous rules stay in force: %s", exc)
                return
            log.info("ACL rules reloaded from %s: %d account(s), %d global whitelist pattern(s)", self.path,
                     len(self.rules.accounts), len(self.rules.global_white))

    async def watch(self) -> None:
        """Look at the file every POLL_INTERVAL_S (run as a task): a process that sees no request
        still picks the new rules up, as Apache's watcher thread does."""
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            self.maybe_reload()

    def check(self, code: int, ext: Mapping[str, str], body: bytes | None, peer: str,
              version: int = 0) -> AclDenied | None:
        """None if the request may proceed, else the denial (logged: peer and access key, never secrets)."""
        self.maybe_reload()
        try:
            validate(self.rules, AccessRequest(code, ext, body or b"", host_of(peer), version), self.admin_codes)
        except AclDenied as denied:
            log.warning("ACL refused %s from %s (accessKey=%s): %s", request_code_name(code), peer,
                        ext.get(ACCESS_KEY), denied.message)
            return denied
        return None
