"""The two ways ACL says no: a bad ``plain_acl.yml`` (operator error) and a refused request."""

from __future__ import annotations

# Apache's exception and the frames its message is thrown from: a denied request's remark is Java's
# ``RemotingHelper.exceptionSimpleDesc(e)`` = ``e.toString() + ", " + e.getStackTrace()[0]``.
ACL_EXCEPTION_CLASS = "org.apache.rocketmq.acl.common.AclException"
FRAME_VALIDATE = "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java)"
FRAME_CHECK_PERM = "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java)"
FRAME_PARSE = "org.apache.rocketmq.acl.plain.PlainAccessValidator.parse(PlainAccessValidator.java)"


class AclConfigError(ValueError):
    """``plain_acl.yml`` cannot be used; the message names the file and the field."""


class AclDenied(Exception):
    """A request the ACL refuses. ``message`` is Apache's AclException message; ``frame`` the Java
    stack frame Apache's remark ends with (the line number is left out: it differs per release)."""

    def __init__(self, message: str, frame: str = FRAME_VALIDATE) -> None:
        super().__init__(message)
        self.message = message
        self.frame = frame

    @property
    def remark(self) -> str:
        """The remark Apache 4.9 answers a denied request with (code SYSTEM_ERROR)."""
        return f"{ACL_EXCEPTION_CLASS}: {self.message}, {self.frame}"
