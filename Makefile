# One-command entry points (README). Everything runs from the project's own venv.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
# `run` pipes flwr's output and must keep its exit status.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# Our processes already have every dependency; Flower must not re-install them
# into a runtime environment per run (multi-GB torch download).
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
# The local SuperLink's SuperExec looks for a new run once a second by default;
# every `flwr run` waited up to that long before its simulation started.
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL := 0.1

# Filter for `flwr run --stream`'s output, which still streams through it.
# Flower's simulation process logs its (empty) exit message after the ServerApp
# has finished: hold back such a bare "INFO :" line and drop it at the very end,
# so that the results folder stays the last line. `flwr run` exits 0 even when
# the run failed, so fail unless the ServerApp printed its "results: " line.
RUN_OUTPUT_FILTER := awk '{ if (held != "") print held; held = ""; \
	if ($$0 ~ /^(\033\[[0-9;]*m)?INFO (\033\[0m)?: *$$/) { held = $$0; next } \
	if ($$0 ~ /^results: /) done = 1; print; fflush() } \
	END { if (!done) { print "make run: the run failed (no results folder; see above)" > "/dev/stderr"; exit 1 } }'

PYPROJECT_KEPT := .pyproject.toml.before-flwr-run

.PHONY: setup run test test-all lint stop-local-superlink reproduce reproduce-quick \
	reproduce-papers

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# The main job: IFCA on 4-rotation digits, 20 simulated clients, no download.
# `flwr run` starts a local SuperLink (127.0.0.1:39091) and leaves it running.
# One left by an earlier `flwr run` may lack the variable above, so stop it
# first; stop ours afterwards, whatever the run's outcome, so nothing outlives
# the job. Both by the PID listening on that port (deploy/stop-local-superlink.sh).
#
# `flwr run` 1.41 moves pyproject.toml's [tool.flwr.federations] table to
# ~/.flwr/config.toml and comments it out in place; the job puts the file back so
# that the checkout stays as it was (the federation is also given explicitly).
run: setup
	@deploy/stop-local-superlink.sh --quiet
	$(info flwr run . --stream --federation-config "num-supernodes=20 client-resources-num-cpus=1" $(RUN_ARGS))
	@cp -p pyproject.toml $(PYPROJECT_KEPT); status=0; PATH=$(BIN):$$PATH flwr run . --stream \
		--federation-config "num-supernodes=20 client-resources-num-cpus=1" $(RUN_ARGS) \
		| $(RUN_OUTPUT_FILTER) || status=$$?; \
	mv $(PYPROJECT_KEPT) pyproject.toml; deploy/stop-local-superlink.sh --quiet; exit $$status

stop-local-superlink:
	deploy/stop-local-superlink.sh

# The suite runs on TEST_WORKERS processes (pytest-xdist): a federation of the
# suite keeps about one core busy, so two share a 2-core machine. Tests of the one
# local SuperLink, the deployments and the Ray cluster run in one process, one
# after another (the "machine" group, tests/conftest.py).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test: setup
	$(PYTEST) -m "not slow"

# The slowest tests are listed at the end, so that CI's log shows where time goes.
test-all: setup
	$(PYTEST) --durations=25

lint: setup
	$(BIN)/ruff check fl_clusters tests benchmarks examples

# Every benchmark grid as a sweep file (docs/sweeps.md); results in results/sweeps/.
# A sweep started again skips the runs it has recorded. quick.toml is a slice of
# the clustering matrix, for reproduce-quick (its time on 2 cores: the "quick" sweep's
# manifest and runs.jsonl under benchmarks/measured/sweeps/quick/).
SWEEPS := $(filter-out benchmarks/sweeps/quick.toml benchmarks/sweeps/reproduce-%.toml,\
	$(wildcard benchmarks/sweeps/*.toml))
# One sweep per paper (benchmarks/sweeps/reproduce-*.toml), recorded under
# benchmarks/measured/sweeps/ and read by docs/generate_reproductions.py into
# docs/reproductions.md. Resumable: a sweep started again skips the runs it has
# recorded. A sweep with a failed run still lets the others run; the target then fails.
PAPER_SWEEPS := $(wildcard benchmarks/sweeps/reproduce-*.toml)

reproduce: setup
	@for sweep in $(SWEEPS); do $(PY) -m fl_clusters.sweep $$sweep || exit $$?; done

reproduce-quick: setup
	$(PY) -m fl_clusters.sweep benchmarks/sweeps/quick.toml

reproduce-papers: setup
	@status=0; for sweep in $(PAPER_SWEEPS); do \
		$(PY) -m fl_clusters.sweep $$sweep --out benchmarks/measured/sweeps/$$(basename $$sweep .toml) \
			|| status=$$?; \
	done; $(PY) docs/generate_reproductions.py && exit $$status
