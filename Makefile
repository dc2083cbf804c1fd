# kqp: two commands for a new user.
#   make demo   set everything up, start Kafka + the proxy, push a workload through it, print what happened
#   make test   set everything up and run the whole test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
KAFKA_VERSION := 4.3.1
KAFKA_DIR := .cache/kafka-$(KAFKA_VERSION)

.PHONY: demo test test-busy lint typecheck unit integration bench bench-simulator system-test setup compiled kafka kafka-messages system-deps clean

setup: $(VENV)/.installed compiled kafka system-deps

# The editable install is pure (KQP_PURE=1); `compiled` below builds the compiled modules in place.
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip 'setuptools>=77'
	KQP_PURE=1 $(VENV)/bin/pip install -q -e '.[dev,spark]'
	touch $@

# The per-request modules (kqp/compiled_modules.py) compiled with mypyc from their own source, in
# place (*.so, git-ignored; C sources under build/), rebuilt when a source of theirs changes;
# the old ones go first, so that a module taken off the list leaves no extension behind.
# Without a C compiler setup.py warns and the pure build runs (kqp/__init__.py picks it). About
# 1.5 min on 2 loaded cores (docs/benchmarks.md, "Compiled build").
COMPILED_STAMP := build/.compiled
compiled: $(COMPILED_STAMP)

$(COMPILED_STAMP): $(VENV)/.installed setup.py $(wildcard kqp/protocol/*.py kqp/quotas/*.py) kqp/frozen_value.py \
		kqp/protocol/generated/walks/produce.py \
		kqp/proxy/traffic_metrics.py kqp/proxy/connection.py kqp/proxy/exchange.py kqp/proxy/hook_chain.py \
		kqp/proxy/hooks.py kqp/proxy/policies/policy.py \
		kqp/proxy/observation.py \
		kqp/proxy/policies/chain.py kqp/proxy/policies/kafka_charging.py kqp/proxy/policies/charges.py \
		kqp/proxy/policies/one_at_a_time.py \
		kqp/spark_jobs/replay_loop.py kqp/compiled_modules.py
	@mkdir -p build; rm -f kqp/*.so kqp/*/*.so kqp/*/*/*.so kqp/*/*/*/*.so kqp_compiled__mypyc*.so; start=$$(date +%s); \
	$(PY) setup.py -q build_ext --inplace > build/compile.log 2>&1 || { cat build/compile.log; exit 1; }; \
	grep -i '^warning: kqp' build/compile.log >&2 || true; \
	pure_because=$$($(PY) -c 'import kqp; print(kqp.PURE_BECAUSE or "")'); \
	if [ -z "$$pure_because" ]; then echo "compiled kqp's per-request modules in $$(( $$(date +%s) - start )) s"; \
	else echo "warning: kqp runs its pure build ($$pure_because; the same sources, interpreted, slower):" \
	  "install gcc and Python's headers, then 'rm $@; make setup'; meanwhile 'make test EXPECT_BUILD=pure'" >&2; fi
	touch $@

# Kafka broker and CLI tools, assembled from Maven Central (no tarball, no Docker).
kafka: $(KAFKA_DIR)/libs/.complete

$(KAFKA_DIR)/libs/.complete: harness/pom.xml
	mvn -B -q -f harness/pom.xml dependency:copy-dependencies
	touch $@

# Refresh the committed copy of Kafka's JSON message definitions from the jar, then regenerate the
# codec from them (kqp/protocol/generated; a unit test fails when the committed module is stale).
kafka-messages: kafka
	./harness/extract_kafka_messages.sh $(KAFKA_VERSION)
	$(PY) -m harness.kafka_codegen

# From Debian, installed when missing: kcat (librdkafka's CLI), prometheus (its package ships
# promtool too) for the Prometheus integration test, and haproxy for the fleet behind a balancer;
# and libnss-myhostname, whose glibc module resolves every name under .localhost to loopback, for
# the SNI routing test's host names (docs/testing.md; its install adds it to /etc/nsswitch.conf).
SYSTEM_COMMANDS := kcat:kcat prometheus:prometheus promtool:prometheus haproxy:haproxy
LOCALHOST_PROBE := kqp-probe.localhost
system-deps:
	@missing=$$(for pair in $(SYSTEM_COMMANDS); do command -v $${pair%%:*} >/dev/null || echo $${pair#*:}; done \
	  | sort -u); \
	getent ahosts $(LOCALHOST_PROBE) >/dev/null || missing="$$missing libnss-myhostname"; \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; }; \
	getent ahosts $(LOCALHOST_PROBE) >/dev/null || echo "warning: $(LOCALHOST_PROBE) does not resolve: add" \
	  "myhostname to the hosts: line of /etc/nsswitch.conf (the SNI routing test needs it)" >&2

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy kqp
	$(VENV)/bin/lint-imports

# The lint and the whole suite on the compiled build; tests/unit/test_build.py fails when the
# build that ran is not the one KQP_EXPECT_BUILD names, and runs the protocol and quota unit tests
# again on the pure one (KQP_PURE=1: the same sources, interpreted).
# tests/run_suite.sh: the real-time tests (marker `integration`: tests/integration and the Spark
# tests on a real broker) one after another in one pytest; beside them `make lint`, then the unit
# and packaging tests, then the other Spark tests (the script says why that is safe). A lint
# failure fails `make test` at the end, with the tests' results beside it.
# Bytecode is compiled once first: where PYTHONDONTWRITEBYTECODE is set (it is on this project's
# build hosts) every `kqp serve` and Spark worker the tests start would otherwise compile kqp
# again, 0.27 s of CPU per process.
PYTEST_ALL = $(PY) -m compileall -q kqp harness > /dev/null && KQP_EXPECT_BUILD=$(EXPECT_BUILD) tests/run_suite.sh
# On a machine without a C compiler (`make setup` warns): `make test EXPECT_BUILD=pure`.
EXPECT_BUILD ?= compiled

test: setup
	$(PYTEST_ALL)

# The same suite with one CPU-bound loop on the host the whole time (issue 39 asks every fresh
# clone to pass so; docs/testing.md). The loop is stopped however pytest ends.
test-busy: setup
	$(PY) -c 'while True: pass' & loop=$$!; trap "kill $$loop" EXIT; $(PYTEST_ALL)

unit: $(VENV)/.installed
	$(VENV)/bin/pytest -q tests/unit

integration: setup
	$(VENV)/bin/pytest -q tests/integration

demo: setup
	$(PY) -m harness.demo

# Benchmarks print progress and write markdown reports under out/; figures go to docs/benchmarks.md.
bench: setup
	$(PY) bench/quota_hot_path.py
	$(PY) bench/fast_path.py
	$(PY) bench/proxy_throughput.py
	$(PY) bench/capture_overhead.py

# The deterministic simulator's scenario table (kqpsim) over thousands of seeds (make test runs 412).
SIM_SEEDS ?= 100
bench-simulator: $(VENV)/.installed
	$(PY) bench/simulator.py --seeds $(SIM_SEEDS)

# Wire accuracy beside Kafka's broker (issue 39), NOT part of `make test`: each shape through kqp
# and straight to one Kafka broker in the same run, ROUNDS times, medians and spreads, acceptance
# bounds as PASS/FAIL lines (docs/testing.md). About 25 minutes a round; SHAPES=fleet,ten-fair,...
# selects shapes (bench/system_test.py --help). Run it through ../shared/tools/heavy on a shared host.
ROUNDS ?= 3
SHAPES ?=
system-test: setup
	$(PY) bench/system_test.py --rounds $(ROUNDS) $(if $(SHAPES),--shapes $(SHAPES))

clean:
	rm -rf $(VENV) .cache build kqp/*.so kqp/*/*.so kqp_compiled__mypyc*.so
