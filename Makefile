# rocketlake: every target builds or refreshes .venv itself, so a fresh clone needs only these.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPARK_CDS := $(VENV)/share/rocketlake/spark-driver.json
JAVA_BINARY := $(realpath $(shell command -v java 2>/dev/null))
DEMO_DIR ?= build/demo
AZURITE := tests/azurite/node_modules/.bin/azurite-blob
DEMO_DELAY_LEVELS := 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s

.PHONY: venv test demo java-check clean

venv: $(STAMP) $(SPARK_CDS)

# pipelines/spark_python_path.py: Spark's Python processes import pyspark from site-packages (with its
# bytecode cache) rather than compile it from Spark's zips at every start
$(STAMP): pyproject.toml constraints.txt pipelines/spark_python_path.py
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 (e.g. 'apt-get install python3.11 python3.11-venv' or pyenv)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	$(BIN)/python -m pip check
	$(BIN)/python -m pipelines.spark_python_path install
	@touch $(STAMP)

# pipelines/spark_cds.py: the class-data-sharing archive of Spark's JVMs (one training run, ~50 s),
# which halves every job JVM's start; rebuilt when the venv, the module or the JDK changes (its
# sidecar .json, written last, is the target). The launchers pass it (python -m pipelines.job_args).
# Without Java 17 (targets that need no Spark) it is left for a later make, with a note.
$(SPARK_CDS): $(STAMP) pipelines/spark_cds.py $(JAVA_BINARY)
	@if java -version 2>&1 | grep -q 'version "17'; then $(BIN)/python -m pipelines.spark_cds build; \
	else echo "note: no Java 17 on PATH, so Spark's class archive is not built yet (make builds it once Java is there)"; fi

java-check:
	@java -version 2>&1 | grep -q 'version "17' || { echo "error: Java 17 is needed by Spark; install it with 'apt-get install openjdk-17-jdk-headless' and put it on PATH (or set JAVA_HOME)"; exit 1; }

# --durations: every run names its 25 slowest steps, so a suite that grows slower says where
test: venv java-check $(AZURITE)
	$(BIN)/python -m pytest -q --durations=25

# Azurite (Microsoft's Azure Storage emulator, from npm at the version tests/azurite/package-lock.json
# pins): the Azure Blob endpoint of tests/test_ingest_azure.py, as moto_server is the S3 one
$(AZURITE): tests/azurite/package.json tests/azurite/package-lock.json
	@command -v npm >/dev/null || { echo "error: npm not found; the tests' Azure emulator (Azurite) comes from npm: install Node.js 18+ with npm (e.g. 'apt-get install nodejs npm')"; exit 1; }
	cd tests/azurite && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# the Spark properties every launcher passes (jobs/spark-submit.conf's JVM options and the driver's class
# archive), as --conf arguments from pipelines.job_args, when a recipe runs; shell-quoted (a JVM option
# list holds spaces), hence the eval
SUBMIT = eval "env SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$(CURDIR)/$(BIN)/python $(BIN)/spark-submit \
	--master 'local[2]' --conf spark.ui.showConsoleProgress=false $$($(BIN)/python -m pipelines.job_args)"
DEMO_STORE := --store broker-a=$(DEMO_DIR)/broker-store --lake $(DEMO_DIR)/lake

demo: venv java-check
	rm -rf $(DEMO_DIR)
	$(BIN)/python -m broker.demo_traffic --start $(DEMO_DIR)/broker-store
	@echo "== consumer lag after the first round of traffic (snapshot 1)"
	$(SUBMIT) jobs/consumer_lag.py $(DEMO_STORE) --group demo-lags 2>$(DEMO_DIR)/lag-1.log
	@echo "== a second, larger round of traffic on the same store (demo-lags falls further behind)"
	$(BIN)/python -m broker.demo_traffic --start $(DEMO_DIR)/broker-store --orders 700
	$(BIN)/rocketlake store verify $(DEMO_DIR)/broker-store --message-delay-level "$(DEMO_DELAY_LEVELS)"
	$(BIN)/rocketlake store queues $(DEMO_DIR)/broker-store --topic Orders
	$(BIN)/rocketlake store messages $(DEMO_DIR)/broker-store --topic %DLQ%demo-fails --limit 3 --format table
	@echo "== payload schemas for Orders and Payments (typed tables payload_orders, payload_payments)"
	$(BIN)/rocketlake schema install pipelines/payloads/demo/payload_schemas.toml --lake $(DEMO_DIR)/lake
	@echo "== ingest into Delta tables under $(DEMO_DIR)/lake"
	$(SUBMIT) jobs/ingest_commitlog.py $(DEMO_STORE) 2>$(DEMO_DIR)/ingest.log | grep '^ingest'
	@echo "== consumer lag (snapshot 2), status, and the lag plot $(DEMO_DIR)/lag.png"
	$(SUBMIT) jobs/consumer_lag.py $(DEMO_STORE) --group demo-lags --plot $(DEMO_DIR)/lag.png 2>$(DEMO_DIR)/lag-2.log
	@echo "== dead-letter queue summary"
	$(SUBMIT) jobs/dlq_report.py $(DEMO_STORE) --no-ingest 2>$(DEMO_DIR)/dlq.log
	@echo "== store audit"
	$(SUBMIT) jobs/audit.py $(DEMO_STORE) --no-ingest 2>$(DEMO_DIR)/audit.log
	@echo "== data quality (Great Expectations)"
	$(SUBMIT) jobs/validate.py --lake $(DEMO_DIR)/lake 2>$(DEMO_DIR)/validate.log
	@echo "== replay: the DLQ back to Payments once the consumer is fixed, and half of Orders into a new topic"
	$(BIN)/python -m pipelines.replay.demo --start $(DEMO_DIR)/broker-store --lake $(DEMO_DIR)/lake
	@echo "== dead-letter queue summary after the replay (replayed = sent back, from replay_ledger)"
	$(SUBMIT) jobs/dlq_report.py $(DEMO_STORE) --no-ingest 2>$(DEMO_DIR)/dlq-2.log
	@echo "== SQL over the lake (rocketlake sql: DuckDB by default; --engine datafusion|spark give the same answers)"
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake "SELECT topic, count(*) AS messages, sum(octet_length(body)) AS body_bytes FROM messages GROUP BY topic ORDER BY messages DESC"
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake --saved message_by_key --param key=order-7
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake --saved lagging_groups
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake --saved dlq_volume
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake 'SELECT "order", amount, tags, store_time FROM payload_orders WHERE amount >= 98 ORDER BY "order" LIMIT 5'
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake --saved dlq_payloads --param payload_table=payload_payments --max-rows 5
	$(BIN)/rocketlake sql --lake $(DEMO_DIR)/lake --engine datafusion "SELECT run_id, status, planned, sent, selection FROM replay_runs ORDER BY started_at"
	@echo "== streaming ingest following live traffic (500 msg/s for 10 s): freshness from store to lake"
	$(BIN)/python benchmarks/freshness.py --rates 500 --seconds 10 --producers 1 --threads 2 --root $(DEMO_DIR)/freshness
	$(BIN)/rocketlake store generate $(DEMO_DIR)/store --messages 20000 --topics 4 --queues 4 --seed 7 --segment-bytes 4M --index-slots 5000
	$(BIN)/rocketlake store verify $(DEMO_DIR)/store
	$(BIN)/rocketlake store queues $(DEMO_DIR)/store
	$(BIN)/rocketlake store messages $(DEMO_DIR)/store --limit 5 --format table
	$(BIN)/rocketlake store index $(DEMO_DIR)/store --topic demo-topic-0 --key order-1

# ---- Spark standalone cluster on this machine (pipelines/cluster.py): a master at
# spark://127.0.0.1:$(CLUSTER_MASTER_PORT) (default 7077) and CLUSTER_WORKERS workers on loopback, each
# its own JVM from the pyspark wheel; pid files, logs and the workers' work dirs under CLUSTER_DIR.
# Settings left empty take pipelines/cluster.py's defaults (master web UI 8090, 2 workers with 1 core
# and 1g each), e.g.  make cluster-up CLUSTER_WORKERS=3 CLUSTER_WORKER_MEMORY=2g
# 'python -m pipelines.cluster status' prints the master URL and the workers.
CLUSTER_DIR ?= build/cluster
CLUSTER_MASTER_PORT ?=
CLUSTER_MASTER_UI_PORT ?=
CLUSTER_WORKERS ?=
CLUSTER_WORKER_CORES ?=
CLUSTER_WORKER_MEMORY ?=
PYFILES := build/rocketlake-pyfiles.zip
PYFILES_SOURCES := $(shell find broker pipelines schemas -type f ! -path '*/__pycache__/*' ! -name '*.pyc' 2>/dev/null)
.PHONY: cluster-up cluster-down pyfiles

# the project's packages in one zip for 'spark-submit --py-files' (rebuilt when a source changes)
pyfiles: $(PYFILES)

$(PYFILES): $(STAMP) pyproject.toml $(PYFILES_SOURCES)
	$(BIN)/python -m pipelines.cluster pyfiles --out $@

CLUSTER_UP_ARGS = --dir $(CLUSTER_DIR) $(if $(CLUSTER_MASTER_PORT),--master-port $(CLUSTER_MASTER_PORT)) \
	$(if $(CLUSTER_MASTER_UI_PORT),--master-ui-port $(CLUSTER_MASTER_UI_PORT)) \
	$(if $(CLUSTER_WORKERS),--workers $(CLUSTER_WORKERS)) $(if $(CLUSTER_WORKER_CORES),--worker-cores $(CLUSTER_WORKER_CORES)) \
	$(if $(CLUSTER_WORKER_MEMORY),--worker-memory $(CLUSTER_WORKER_MEMORY))

cluster-up: venv java-check pyfiles
	$(BIN)/python -m pipelines.cluster up $(strip $(CLUSTER_UP_ARGS))

cluster-down: venv
	$(BIN)/python -m pipelines.cluster down --dir $(CLUSTER_DIR)

# Benchmarks: one bench-<name> target per benchmarks/<name>.py (the send path, benchmarks/send_path.py, is
# bench-broker); tests/test_benchmarks.py checks the mapping and runs each script with tiny sizes.
# Defaults are the real sizes; pass others with BENCH_ARGS, e.g.
#   make bench-decode BENCH_ARGS="--gib 0.05"
#   make bench-broker BENCH_ARGS="--seconds 1 --producers 1 --threads 1 --raw-messages 1000 --skip-cpp"
#   make bench-ingest BENCH_ARGS="--sizes-gib 0.01 --broker-max-gib 0.01 --root build/bench-smoke"
#   make bench-replay BENCH_ARGS="--messages 5000"
#   make bench-sql BENCH_ARGS="--rows 200000 --engines duckdb datafusion"
#   make bench-freshness BENCH_ARGS="--rates 1000 --seconds 30"
#   make bench-dispatch BENCH_ARGS="--messages 50000"
BENCH_ARGS ?=
.PHONY: bench-decode bench-broker bench-ingest bench-replay bench-sql bench-freshness bench-dispatch

bench-decode: venv
	$(BIN)/python benchmarks/decode.py $(BENCH_ARGS)

bench-broker: venv
	$(BIN)/python benchmarks/send_path.py $(BENCH_ARGS)

bench-ingest: venv java-check
	$(BIN)/python benchmarks/ingest.py $(BENCH_ARGS)

bench-replay: venv java-check
	$(BIN)/python benchmarks/replay.py $(BENCH_ARGS)

bench-sql: venv java-check
	$(BIN)/python benchmarks/sql.py $(BENCH_ARGS)

bench-freshness: venv java-check
	$(BIN)/python benchmarks/freshness.py $(BENCH_ARGS)

bench-dispatch: venv
	$(BIN)/python benchmarks/dispatch.py $(BENCH_ARGS)

# ---- Airflow (airflow_dags/): its own virtualenv, because Airflow pins many packages; the project's
# .venv keeps Spark, and the DAGs run the jobs with .venv's spark-submit. constraints-airflow.txt is
# the lock: a pip freeze of a resolved, pip-check-clean install of AIRFLOW_REQUIREMENTS (refresh it
# with 'make airflow-lock'). The Spark provider pulls pyspark-client, which shares files with
# pyspark: it is pinned to the project's pyspark version and pyspark itself never goes in here.
AIRFLOW_VENV := .venv-airflow
AIRFLOW_BIN := $(AIRFLOW_VENV)/bin
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed
AIRFLOW_REQUIREMENTS := apache-airflow==3.3.2 apache-airflow-providers-apache-spark==6.3.4 pyspark-client==4.2.0 pytest==9.2.0
AIRFLOW_HOME_DIR ?= $(CURDIR)/build/airflow
AIRFLOW_PORT ?= 8080
AIRFLOW_ENV = AIRFLOW_HOME=$(AIRFLOW_HOME_DIR) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/airflow_dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__API__HOST=127.0.0.1 AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__API__BASE_URL=http://127.0.0.1:$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$(AIRFLOW_PORT)/execution/ \
	SPARK_LOCAL_IP=127.0.0.1
.PHONY: airflow airflow-lock airflow-standalone test-airflow

airflow: $(AIRFLOW_STAMP)

$(AIRFLOW_STAMP): constraints-airflow.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11"; exit 1; }
	@test -x $(AIRFLOW_BIN)/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_BIN)/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_BIN)/python -m pip install --quiet -c constraints-airflow.txt $(AIRFLOW_REQUIREMENTS)
	$(AIRFLOW_BIN)/python -m pip check
	@if $(AIRFLOW_BIN)/python -m pip show --quiet pyspark >/dev/null 2>&1; then \
		echo "error: pyspark is installed in $(AIRFLOW_VENV); it shares files with pyspark-client: rm -rf $(AIRFLOW_VENV) and rerun"; exit 1; fi
	@touch $@

# a new lock from a fresh resolve (commit the changed constraints-airflow.txt)
airflow-lock:
	rm -rf build/airflow-lock && $(PYTHON) -m venv build/airflow-lock
	build/airflow-lock/bin/python -m pip install --quiet --upgrade pip
	build/airflow-lock/bin/python -m pip install --quiet $(AIRFLOW_REQUIREMENTS)
	build/airflow-lock/bin/python -m pip check
	build/airflow-lock/bin/python -m pip freeze > constraints-airflow.txt
	rm -rf build/airflow-lock

# Airflow on this machine, UI on loopback only, DAG folder airflow_dags/, state in build/airflow.
# First start: the Spark connection (local[2]) and the Variables rocketlake_lake/rocketlake_stores
# are created when missing (stores: the 'make demo' store; change them in Admin -> Variables).
airflow-standalone: airflow venv java-check
	@mkdir -p $(AIRFLOW_HOME_DIR)
	@$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow db migrate >$(AIRFLOW_HOME_DIR)/db-migrate.log 2>&1 || { cat $(AIRFLOW_HOME_DIR)/db-migrate.log; exit 1; }
	@$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow connections get spark_default >/dev/null 2>&1 || \
		$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow connections add spark_default --conn-type spark --conn-host 'local[2]' >/dev/null
	@$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow variables get rocketlake_lake >/dev/null 2>&1 || \
		$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow variables set rocketlake_lake $(AIRFLOW_HOME_DIR)/lake >/dev/null
	@$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow variables get rocketlake_stores >/dev/null 2>&1 || \
		$(AIRFLOW_ENV) $(AIRFLOW_BIN)/airflow variables set rocketlake_stores '{"broker-a": "$(CURDIR)/$(DEMO_DIR)/broker-store"}' >/dev/null
	@echo "== Airflow UI/API on http://127.0.0.1:$(AIRFLOW_PORT) (loopback), DAGs from airflow_dags/, state in $(AIRFLOW_HOME_DIR)"
	@echo "== log in as 'admin'; the password is printed below on the first start and kept in"
	@echo "   $(AIRFLOW_HOME_DIR)/simple_auth_manager_passwords.json.generated"
	@echo "== stores: Variable rocketlake_stores ('make demo' makes $(DEMO_DIR)/broker-store); new DAGs start paused"
	@echo "   (unpause them in the UI); Ctrl-C stops Airflow"
	$(AIRFLOW_ENV) PATH="$(CURDIR)/$(AIRFLOW_BIN):$$PATH" airflow standalone

# the DAGs' tests, in the Airflow virtualenv: DagBag integrity, then 'airflow dags test' runs of the
# DAGs against a copy of the golden store (they need .venv for spark-submit)
test-airflow: airflow venv java-check
	SPARK_LOCAL_IP=127.0.0.1 $(AIRFLOW_BIN)/python -m pytest -q tests/airflow

clean:
	rm -rf build $(VENV) $(AIRFLOW_VENV) tests/azurite/node_modules
