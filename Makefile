# rocketlake: every target builds or refreshes .venv itself, so a fresh clone needs only these.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= build/demo
DEMO_DELAY_LEVELS := 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s

.PHONY: venv test demo java-check clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 (e.g. 'apt-get install python3.11 python3.11-venv' or pyenv)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	$(BIN)/python -m pip check
	@touch $(STAMP)

java-check:
	@java -version 2>&1 | grep -q 'version "17' || { echo "error: Java 17 is needed by Spark; install it with 'apt-get install openjdk-17-jdk-headless' and put it on PATH (or set JAVA_HOME)"; exit 1; }

test: venv java-check
	$(BIN)/python -m pytest -q

SUBMIT = SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$(CURDIR)/$(BIN)/python $(BIN)/spark-submit --master 'local[2]' \
	--conf spark.ui.showConsoleProgress=false
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
	$(BIN)/rocketlake store generate $(DEMO_DIR)/store --messages 20000 --topics 4 --queues 4 --seed 7 --segment-bytes 4M --index-slots 5000
	$(BIN)/rocketlake store verify $(DEMO_DIR)/store
	$(BIN)/rocketlake store queues $(DEMO_DIR)/store
	$(BIN)/rocketlake store messages $(DEMO_DIR)/store --limit 5 --format table
	$(BIN)/rocketlake store index $(DEMO_DIR)/store --topic demo-topic-0 --key order-1

# Benchmarks: one bench-<name> target per benchmarks/<name>.py (the send path, benchmarks/send_path.py, is
# bench-broker); tests/test_benchmarks.py checks the mapping and runs each script with tiny sizes.
# Defaults are the real sizes; pass others with BENCH_ARGS, e.g.
#   make bench-decode BENCH_ARGS="--gib 0.05"
#   make bench-broker BENCH_ARGS="--seconds 1 --producers 1 --threads 1 --raw-messages 1000 --skip-cpp"
#   make bench-ingest BENCH_ARGS="--sizes-gib 0.01 --broker-max-gib 0.01 --root build/bench-smoke"
#   make bench-replay BENCH_ARGS="--messages 5000"
BENCH_ARGS ?=
.PHONY: bench-decode bench-broker bench-ingest bench-replay

bench-decode: venv
	$(BIN)/python benchmarks/decode.py $(BENCH_ARGS)

bench-broker: venv
	$(BIN)/python benchmarks/send_path.py $(BENCH_ARGS)

bench-ingest: venv java-check
	$(BIN)/python benchmarks/ingest.py $(BENCH_ARGS)

bench-replay: venv java-check
	$(BIN)/python benchmarks/replay.py $(BENCH_ARGS)

clean:
	rm -rf build $(VENV)
