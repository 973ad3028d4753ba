# One-command entry points (README). Everything runs from the project's own venv.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
# The Flower releases the project supports (pyproject.toml's range,
# docs/flower-versions.md): the venv holds the first, `make test-flwr-1.42` runs
# the fast suite on the second.
FLWR_PINNED := 1.41.0
FLWR_NEWER := 1.42.0
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

.PHONY: setup run test test-all test-flwr-1.42 lint stop-local-superlink reproduce \
	reproduce-quick reproduce-papers

setup: $(VENV)/.installed

# pyproject.toml admits every supported Flower; the venv holds the one that the
# measured numbers and the full suite use.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e ".[dev]" "flwr[simulation]==$(FLWR_PINNED)"
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
# tests/test_one_file.py runs the whole fast suite again, in a copy of the
# repository with one strategy file added: test-all leaves it to test-flwr-1.42,
# which runs it on the newer Flower, so that one run of the fast suite is both the
# one-file proof and the newer Flower's fast suite (CI runs both targets).
ONE_FILE_TEST := tests/test_one_file.py
test-all: setup
	$(PYTEST) --durations=25 --ignore=$(ONE_FILE_TEST)

# The fast suite on the newer supported Flower, from a venv that builds in seconds:
# it holds flwr $(FLWR_NEWER), what flwr $(FLWR_NEWER) requires at a version that
# flwr $(FLWR_PINNED) excludes (their Requires-Dist) and fl-clusters (editable, so
# that `pip check` holds pyproject.toml's range against $(FLWR_NEWER)), and finds
# every other package (torch, Ray, ...) in $(VENV) after its own (a .pth file that
# calls site.addsitedir, so that $(VENV)'s own .pth files apply too). Its bin/ holds
# a copy of each of $(VENV)'s commands (pytest, ray, ...) that runs its python: the
# suite starts `flwr`, the SuperLink and the deploy scripts from there.
NEWER_VENV := .venv-flwr-$(FLWR_NEWER)
NEWER_PY := $(NEWER_VENV)/bin/python
FLWR_NEWER_RAISED := "uv>=0.13.5,<0.14"

$(NEWER_VENV)/.installed: $(VENV)/.installed pyproject.toml
	rm -rf $(NEWER_VENV)
	$(PY) -m venv --without-pip $(NEWER_VENV)
	$(PY) -m pip --python $(NEWER_PY) install -q --no-deps -e . \
		"flwr[simulation]==$(FLWR_NEWER)" $(FLWR_NEWER_RAISED)
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; \
		print(sysconfig.get_path("purelib"))')')" \
		> "$$($(NEWER_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz-base-venv.pth"
	@for command in $(VENV)/bin/*; do target=$(NEWER_VENV)/bin/$${command##*/}; \
		if [ ! -e $$target ] && head -n1 $$command | grep -qx '#!$(BIN)/python[0-9.]*'; then \
			sed '1s|.*|#!$(abspath $(NEWER_PY))|' $$command > $$target && chmod +x $$target; \
		fi; done
	$(PY) -m pip --python $(NEWER_PY) check
	$(NEWER_VENV)/bin/flwr --version | grep -qx "Flower version: $(FLWR_NEWER)"
	touch $@

# The fast suite on flwr $(FLWR_NEWER), run by $(ONE_FILE_TEST) in a copy of the
# repository that holds one more strategy file (see test-all); then that test's
# own assertions. FAST_SUITE=1 runs the fast suite here as it is instead.
test-flwr-1.42: $(NEWER_VENV)/.installed
	PATH=$(abspath $(NEWER_VENV))/bin:$$PATH FLC_VENV=$(abspath $(NEWER_VENV)) \
		$(NEWER_PY) -m pytest -q -p no:cacheprovider \
		$(if $(FAST_SUITE),-n $(TEST_WORKERS) --dist loadgroup -m "not slow",$(ONE_FILE_TEST))

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
