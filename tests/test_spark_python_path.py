"""Spark's Python processes import pyspark from site-packages, not from Spark's zips (the .pth file
of :mod:`pipelines.spark_python_path`, which ``make venv`` installs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from pipelines.spark_python_path import PTH_LINE, PTH_NAME, main, site_packages

BUNDLED = site_packages() / "pyspark" / "python" / "lib"
ZIPS = sorted(str(p) for p in BUNDLED.glob("*.zip"))


def _python(code: str, pythonpath: list[str], *flags: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    out = subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_make_venv_installed_the_pth_file():
    assert (site_packages() / PTH_NAME).read_text() == PTH_LINE


def test_spark_zips_on_pythonpath_go_after_site_packages():
    assert [Path(z).name for z in ZIPS] == ["py4j-0.10.9.9-src.zip", "pyspark.zip"]
    got = _python("import json, sys, pyspark, py4j; "
                  "print(json.dumps({'path': sys.path, 'pyspark': pyspark.__file__, 'py4j': py4j.__file__}))",
                  [*ZIPS, "/somewhere/else"])
    assert got["pyspark"] == str(site_packages() / "pyspark" / "__init__.py")
    assert got["py4j"] == str(site_packages() / "py4j" / "__init__.py")
    assert got["path"][-2:] == ZIPS                     # moved to the end, in their order
    assert "/somewhere/else" in got["path"][:-2]        # everything else stays where it was
    # without site (python -S) no .pth runs: Spark's order is kept
    plain = _python("import json, sys; print(json.dumps({'path': sys.path}))", ZIPS, "-S")
    assert plain["path"][1:3] == ZIPS


def test_only_zips_of_an_installed_pyspark_move(tmp_path):
    installed = tmp_path / "installed" / "pyspark"     # a pip-installed package: its __init__.py is there
    distribution = tmp_path / "spark-4.2.0" / "pyspark"  # a directory named pyspark without a package
    other = tmp_path / "spark-4.2.0" / "python" / "lib"  # a Spark distribution's SPARK_HOME/python/lib
    for lib in (installed / "python" / "lib", distribution / "python" / "lib", other):
        lib.mkdir(parents=True)
        with zipfile.ZipFile(lib / "pyspark.zip", "w") as zf:
            zf.writestr("marker.py", "")
    (installed / "__init__.py").write_text("")
    kept = [str(distribution / "python" / "lib" / "pyspark.zip"), str(other / "pyspark.zip")]
    moved = str(installed / "python" / "lib" / "pyspark.zip")
    got = _python("import json, sys; print(json.dumps({'path': sys.path}))", [moved, *kept])
    assert got["path"][1:3] == kept and got["path"][-1] == moved


def test_spark_workers_import_pyspark_from_site_packages(spark):
    files = spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("pyspark").__file__).collect()
    assert files == [str(site_packages() / "pyspark" / "__init__.py")] * 2


def test_install_command(tmp_path, capsys):
    assert main(["install", "--site-packages", str(tmp_path)]) == 0
    assert (tmp_path / PTH_NAME).read_text() == PTH_LINE
    assert capsys.readouterr().out == f"installed {tmp_path / PTH_NAME}\n"
    assert main(["install", "--site-packages", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'} is not a directory (give the environment's site-packages)\n"
