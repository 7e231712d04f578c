# Two entry points (see README): `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYSPARK_VERSION := 4.2.0
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install system-tools lint test test-unit test-fast demo try docs bench clean

install: $(VENV)/.installed system-tools

# Debian's RocksDB 7.8 tools (ldb, sst_dump): the tests read every shard with them to prove older
# RocksDB releases read our shards (SPEC §5). Installed only where apt-get exists and we are root;
# elsewhere nothing happens here and those tests fail naming the missing tool.
# Debian's chromium and chromedriver: the deployment test opens the snapshot history UI in a real
# headless browser.
system-tools:
	@if ! command -v ldb >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q rocksdb-tools >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rocksdb-tools >/dev/null; }; \
	fi
	@if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	fi

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q "uv>=0.5"
	@# pyspark and pyspark-client (pulled by the spark provider) share the pyspark/ folder: one version
	@# for both (pyproject only has ranges), and pyspark's files last. So pyspark-client goes in first,
	@# alone; the full install finds it there and writes pyspark over it. Each sdist is built once,
	@# and pyspark installed once (putting it back afterwards, by uninstall + install, counted on uv's
	@# cache still holding the wheel it had built).
	$(VENV)/bin/uv pip install --python $(PY) --no-deps "pyspark-client==$(PYSPARK_VERSION)"
	$(VENV)/bin/uv pip install --python $(PY) -e ".[test]" hatchling "pyspark==$(PYSPARK_VERSION)" "pyspark-client==$(PYSPARK_VERSION)"
	@# Every fresh install builds pyspark from its sdist (~2 GB in uv's cache each time, tests'
	@# venvs included); drop the builds nothing refers to any more, or the disk fills up.
	$(VENV)/bin/uv cache prune --quiet
	touch $@

# ruff (Airflow's rule families), mypy and the import-graph contracts (lint-imports: layers and core's
# purity), configured in pyproject.toml; `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The full gate: three xdist workers, one test file each at a time (files share their Spark session
# and servers through module fixtures); the 25 slowest tests are listed at the end. Three on two
# cores: with two, a quarter of the CPU sat idle while tests waited on JVMs, servers and children.
test: install lint
	$(PY) -m pytest -n 3 --dist loadfile --durations=25

# The shortest loop: the unit tests only (`time make test-unit` says how short on your machine).
test-unit: install
	$(PY) -m pytest tests/unit -q

# Everything that needs neither Spark, nor the S3 server, nor a running Airflow (tests/tiers.py marks
# them from the fixtures they use; a test reaching one of those unmarked fails saying so).
test-fast: install
	$(PY) -m pytest -q -m "not spark and not s3 and not airflow"

demo: install
	$(PY) dags_example/run_demo.py

# Your own DAG file in the demo's Airflow: `make try DAG=path/to/my_dag.py` (CONF='{"rows": 10}' for
# params); exits non-zero when a task failed, which plain dag.test() does not. GNU make exits 2 for
# any failed recipe, so the script's own code is said in the last line, with its meaning for 1 (a task
# failed) and 2 (no DAG); any other (130: Ctrl-C, 137: killed) is shown as it is.
try: install
	@test -n "$(DAG)" || { echo 'usage: make try DAG=path/to/dag.py [CONF=JSON]' >&2; exit 2; }
	@$(PY) dags_example/try_dag.py "$(DAG)" $(if $(CONF),--conf '$(CONF)') || { code=$$?; \
		case $$code in 1) why=' (a task failed)';; 2) why=' (no DAG ran)';; *) why='';; esac; \
		echo "make try: exit code $$code$$why" >&2; exit $$code; }

# The documentation site into site/, warnings as errors (tests/unit/test_docs.py runs the same build
# in `make test`); `$(VENV)/bin/mkdocs serve` for a live preview.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install
	PYTHONPATH=$(abspath tests) $(PY) benchmarks/run_all.py  # the snapshot factory lives with the tests

clean:
	rm -rf $(VENV) .demo dist build site
