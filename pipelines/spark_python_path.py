"""Python processes Spark starts import pyspark from the installed package, not from Spark's zips.

``spark-submit`` and every Python worker Spark starts (the driver of a job, each executor's worker
daemon, each driver-side planner of a Python data source) get ``PYTHONPATH`` with
``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first. With the pip-installed pyspark those zips
sit inside the installed package and hold the very same modules, but Python compiles a zip's modules
from source on every start (zipimport writes no bytecode cache): about 0.9 s of CPU per process,
measured (``import pyspark.daemon``: 1.12 s from the zip, 0.24 s from site-packages), paid by every
worker and planner of every job.

The fix is a ``.pth`` file in the environment's site-packages (``make venv`` installs it; so does
``python -m pipelines.spark_python_path install`` for another environment, a packed one included). Its
one line runs at every interpreter start, before any import, and moves to the end of ``sys.path`` the
zips that lie in ``pyspark/python/lib/`` of an installed pyspark package (a directory with its
``__init__.py``), so the same modules come from site-packages and its ``__pycache__``. A Spark
distribution's zips (no installed package around them) and runs without ``site`` (``python -S``) are
left as they are. The line is self-contained: a ``.pth`` line runs before the project can be
imported, and in executors that only receive the project by ``--py-files``.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "rocketlake-spark-python-path.pth"

# a .pth line starting with "import" is executed by site.py; sort is stable, so only the bundled
# zips move (to the end), everything else keeps its order
PTH_LINE = (
    "import os, sys; sys.path.sort(key=lambda p: p.endswith('.zip') "
    "and os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(p)))) == 'pyspark' "
    "and os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(p))), '__init__.py')))\n"
)


def site_packages() -> Path:
    """The running interpreter's site-packages (``purelib``): where its ``.pth`` files are read."""
    return Path(sysconfig.get_paths()["purelib"])


def install(directory: Path) -> Path:
    """Write the ``.pth`` file into ``directory`` (a site-packages); returns its path."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory (give the environment's site-packages)")
    path = directory / PTH_NAME
    path.write_text(PTH_LINE)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.spark_python_path",
                                 description="Install the .pth file that makes Spark's Python processes "
                                             "import pyspark from site-packages instead of Spark's zips.")
    sub = ap.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="write the .pth file into a site-packages directory")
    inst.add_argument("--site-packages", type=Path, default=None,
                      help="the target site-packages (default: this interpreter's)")
    args = ap.parse_args(argv)
    try:
        path = install(args.site_packages or site_packages())
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"installed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
