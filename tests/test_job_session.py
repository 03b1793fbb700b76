"""pipelines.job_args.job_session: the job's session, with its next imports done while it starts."""

from __future__ import annotations

import sys

from pipelines.job_args import job_session


def test_the_warm_modules_are_imported_by_the_time_the_session_is_there(spark) -> None:
    """The modules named in ``warm`` are imported on a thread while the session starts (here the
    tests' session is taken over, not stopped); a module that fails to import is left for the job's
    own import to raise, and the session still comes."""
    sys.modules.pop("tests.damaged_store", None)
    with job_session("warm", None, warm=["tests.damaged_store", "no_such_module_for_the_test"]) as got:
        assert got is spark
        assert "tests.damaged_store" in sys.modules
        assert "no_such_module_for_the_test" not in sys.modules
    assert not spark.sparkContext._jsc.sc().isStopped()  # a session the job did not create is kept
