"""The C++-client harness tells librocketmq's known abort in shutdown() (after a script reported its
result) from a real crash, which still fails the test."""

from __future__ import annotations

import textwrap

import pytest

from tests.cpp_client import ClientProcess

_ABORT = "terminate called after throwing an instance of 'boost::thread_interrupted'"


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f"""\
        import os, sys
        from _common import announce_shutdown, emit
        {body}
        """))
    return str(path)


def _run(tmp_path, name: str, body: str) -> ClientProcess:
    return ClientProcess(name, tmp_path, [_script(tmp_path, name, body)], timeout=30)


def test_an_abort_in_shutdown_after_the_result_keeps_the_result(tmp_path):
    proc = _run(tmp_path, "after", f"emit({{'sent': 3}}); announce_shutdown(); "
                                   f"sys.stderr.write({_ABORT!r} + '\\n'); sys.stderr.flush(); os.abort()")
    assert proc.result() == {"sent": 3}


@pytest.mark.parametrize("name, body", [
    # the abort before the result: what was sent is unknown
    ("before", f"sys.stderr.write({_ABORT!r} + '\\n'); sys.stderr.flush(); os.abort()"),
    # the result but no shutdown marker: the abort did not come from shutdown()
    ("unmarked", f"emit({{'sent': 3}}); sys.stderr.write({_ABORT!r} + '\\n'); sys.stderr.flush(); os.abort()"),
    # another crash in shutdown
    ("other", "emit({'sent': 3}); announce_shutdown(); os.abort()"),
    ("exit", "emit({'sent': 3}); announce_shutdown(); sys.exit(3)"),
])
def test_any_other_crash_fails(tmp_path, name, body):
    with pytest.raises(AssertionError, match=f"{name} exited with"):
        _run(tmp_path, name, body).result()
