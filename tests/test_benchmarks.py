"""Every benchmark has a make target and still runs: benchmarks/<name>.py ↔ ``make bench-<name>`` (the send
path, benchmarks/send_path.py, is bench-broker), no benchmark shadows a package it imports, and each
script runs with tiny sizes and prints its figures."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
MAKEFILE = REPO / "Makefile"
TARGET_NAME = {"send_path": "broker"}           # benchmarks/<stem>.py whose target is not bench-<stem>
PROJECT_PACKAGES = {"broker", "pipelines", "schemas", "jobs", "tests"}


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]        # "{tmp}" is the test's tmp_path
    figures: tuple[str, ...]     # regexes, each must match a line of stdout
    spark: bool = False
    timeout: float = 120.0


NUM = r"[\d,]+(\.\d+)?"
SMOKE: dict[str, Smoke] = {
    "decode": Smoke(("--gib", "0.01", "--store", "{tmp}/decode"),
                    (rf"^raw read\s+cold\s+{NUM} MB/s\s+warm\s+{NUM} MB/s",
                     rf"^decode\s+cold\s+{NUM} MB/s.*\({NUM} messages/s",
                     r"^decode/raw ratio: cold\s+[\d.]+%"), timeout=60),
    "send_path": Smoke(("--seconds", "1", "--producers", "1", "--threads", "1", "--rate", "500", "--rates", "300",
                        "--raw-messages", "1000", "--skip-cpp", "--root", "{tmp}"),
                       (rf"^raw append .*\s{NUM} msg/s\s+{NUM} MB/s",
                        rf"^pipelined load.*\s{NUM} msg/s\s+p50",
                        rf"^pipelined at 300 msg/s offered\s+{NUM} msg/s\s+p50",
                        r"^  cpu per message \(us\): store \d+, dispatch \d+, network \d+, load generator \d+; total \d+",
                        rf"^SYNC_FLUSH pipelined at 300 msg/s offered\s+{NUM} msg/s\s+p50",
                        rf"^python producers 1x1 \(saturation\)\s+{NUM} msg/s",
                        rf"^python producers at 500 msg/s\s+{NUM} msg/s",
                        r"^broker vs raw append: [\d.]+%",
                        rf"^ASYNC_MASTER \+ slave: pipelined load\s+{NUM} msg/s\s+p50",
                        rf"^SYNC_MASTER \+ slave: pipelined load\s+{NUM} msg/s\s+p50",
                        r"^  slave lag under load \(\d+ samples\): [\d,]+ KiB mean, .* ms p99, .* caught up \d+ ms",
                        rf"^send rate, same run: no slave {NUM} msg/s .*; ASYNC_MASTER {NUM} msg/s .*; "
                        rf"SYNC_MASTER {NUM} msg/s"), timeout=150),
    "ingest": Smoke(("--sizes-gib", "0.01", "--broker-max-gib", "0.01", "--root", "{tmp}"),
                    (rf"^raw read\s+cold\s+{NUM} MB/s\s+warm\s+{NUM} MB/s",
                     rf"^decode only\s+{NUM} MB/s\s+\({NUM} messages/s",
                     rf"^ingest e2e\s+{NUM} MB/s\s+\({NUM} messages/s",
                     rf"^ingest, job time\s+{NUM} MB/s",
                     r"^ingest rows\s+messages ([\d,]+), consume_queue \1, index_entries [\d,]+, corrupt_records [\d,]+, "
                     r"ingest_runs 1$",
                     rf"^ingest peak memory\s+{NUM} MiB RSS, {NUM} MiB anonymous",
                     rf"^broker path\s+{NUM} MB/s",
                     rf"^ingest end to end\s+{NUM} MB/s\s+{NUM} messages/s"), spark=True, timeout=180),
    "replay": Smoke(("--messages", "300", "--rate", "200", "--root", "{tmp}", "--json", "{tmp}/replay.json"),
                    (rf"^send \(baseline\), 1 process\s+300\s+{NUM}\s+{NUM}\s+100%",
                     rf"^replay\s+300\s+{NUM}\s+{NUM}\s+\d+%",
                     rf"^replay --keep-order\s+300\s+{NUM}\s+{NUM}\s+\d+%",
                     rf"^replay --rate 200\s+300\s+{NUM}",
                     r"^replay / send with as many producers: \d+% \(\d task",
                     rf"^--rate 200 msg/s over 300 messages: the target stored them at {NUM} msg/s, error [+-][\d.]+%"),
                    spark=True, timeout=180),
}


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def make_targets() -> dict[str, tuple[list[str], list[str]]]:
    """bench-* targets of the Makefile: name -> (prerequisites, recipe lines)."""
    targets: dict[str, tuple[list[str], list[str]]] = {}
    current = None
    for line in MAKEFILE.read_text().splitlines():
        m = re.match(r"^(bench-[\w-]+):(?!=)(.*)$", line)
        if m:
            current = m.group(1)
            targets[current] = (m.group(2).split(), [])
        elif current and line.startswith("\t"):
            targets[current][1].append(line.strip())
        elif line.strip() and not line.startswith("#"):
            current = None
    return targets


def env() -> dict[str, str]:
    """What ``make``'s Spark runs set (see SUBMIT in the Makefile)."""
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable)


# ---- the mapping ----------------------------------------------------------------------------------------
def test_every_benchmark_has_its_make_target_and_every_target_a_benchmark():
    targets = make_targets()
    runs = {}
    for target, (_, recipe) in targets.items():
        found = re.findall(r"benchmarks/(\w+)\.py\b", " ".join(recipe))
        assert len(found) == 1, f"make {target} should run exactly one benchmarks/*.py, runs {found}"
        runs[target] = found[0]
        assert "$(BENCH_ARGS)" in " ".join(recipe), f"make {target} does not pass $(BENCH_ARGS)"
    assert sorted(runs.values()) == scripts(), "benchmarks without a make target, or targets without a script"
    for target, stem in runs.items():
        assert target == f"bench-{TARGET_NAME.get(stem, stem)}", f"benchmarks/{stem}.py should be make {target}"
    text = MAKEFILE.read_text()
    phony = " ".join(re.findall(r"^\.PHONY:(.*)$", text, re.M)).split()
    for target in targets:
        assert target in phony, f"{target} is not .PHONY"
        assert re.search(rf"^#\s+make {target} BENCH_ARGS=", text, re.M), \
            f"the Makefile's benchmark comment has no example for {target}"


def test_spark_benchmarks_check_java_first():
    targets = make_targets()
    for stem, smoke in SMOKE.items():
        prereqs = targets[f"bench-{TARGET_NAME.get(stem, stem)}"][0]
        assert "venv" in prereqs
        assert ("java-check" in prereqs) == smoke.spark, f"bench for {stem}: java-check iff it runs Spark"


def test_every_benchmark_has_a_smoke_run():
    assert sorted(SMOKE) == scripts(), "give each benchmarks/*.py tiny arguments in SMOKE"


# ---- shadowing: python benchmarks/x.py puts benchmarks/ first on sys.path ------------------------------
def test_no_benchmark_is_named_like_a_package_it_could_shadow():
    repo_top = {p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    repo_top |= {p.stem for p in REPO.glob("*.py")}
    for name in scripts() + sorted(p.name for p in BENCHMARKS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert name not in PROJECT_PACKAGES | repo_top, f"benchmarks/{name} shadows the project's {name}"
        saved = list(sys.path)
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCHMARKS]
        try:
            spec = importlib.util.find_spec(name) if name not in sys.modules else True
        finally:
            sys.path[:] = saved
        assert spec is None, f"benchmarks/{name} shadows the importable module {name!r} for the benchmark scripts"


def test_packages_imported_from_the_benchmarks_directory_are_the_projects():
    probe = ("import sys, broker, pipelines, schemas; "
             "print('\\n'.join(m.__file__ for m in (broker, pipelines, schemas)))")
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); {probe}"],
                         capture_output=True, text=True, timeout=60, cwd=BENCHMARKS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(REPO / p / "__init__.py") for p in ("broker", "pipelines", "schemas")]


@pytest.mark.parametrize("name", scripts())
def test_help(name):
    out = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


# ---- tiny runs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", scripts())
def test_smoke_run(name, tmp_path):
    smoke = SMOKE[name]
    args = [a.replace("{tmp}", str(tmp_path)) for a in smoke.args]
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *args], capture_output=True, text=True,
                         timeout=smoke.timeout, cwd=REPO, env=env())
    took = time.monotonic() - t0
    assert out.returncode == 0, f"benchmarks/{name}.py exited {out.returncode}:\n{out.stdout}\n{out.stderr[-4000:]}"
    for pattern in smoke.figures:
        assert re.search(pattern, out.stdout, re.M), f"no line like {pattern!r} in:\n{out.stdout}"
    print(f"benchmarks/{name}.py smoke run: {took:.1f} s")


# benchmarks/sql.py (issue 10): a 2,000-row synthetic messages table, every engine (Spark included)
SMOKE["sql"] = Smoke(("--rows", "2000", "--root", "{tmp}"),
                     (r"^messages: 2,000 rows, [\d.,]+ MB of Parquet in \d+ files",
                      rf"^pyarrow scan\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",
                      rf"^duckdb\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",
                      rf"^datafusion\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",
                      rf"^spark\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$"), spark=True, timeout=240)

# benchmarks/freshness.py: our broker, 200 msg/s for a few seconds, the streaming job with a 1 s trigger
SMOKE["freshness"] = Smoke(("--rates", "200", "--seconds", "4", "--trigger-interval", "1s", "--producers", "1",
                            "--threads", "2", "--root", "{tmp}", "--json", "{tmp}/freshness.json"),
                           (rf"^freshness at 200 msg/s\s+achieved {NUM} msg/s\s+rows {NUM}/{NUM}\s+p50 {NUM} s\s+"
                            rf"p95 {NUM} s\s+max {NUM} s\s+micro-batches \d+",), spark=True, timeout=240)

# benchmarks/dispatch.py (issue 14): the dispatcher's per-record path vs its compiled runs, same output files
SMOKE["dispatch"] = Smoke(("--messages", "800", "--rounds", "1", "--root", "{tmp}"),
                          (r"^records: 800  changed old/new: 800/800$",
                           rf"^per-record path :\s+{NUM} us/record CPU",
                           rf"^compiled runs   :\s+{NUM} us/record CPU",
                           r"^consume queues and index files: byte-identical$"), timeout=120)
