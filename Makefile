# Every target bootstraps its own virtualenv (.venv) from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DIST   ?= dist
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-two-nodes test-deps tools lint hook codegen bench image clean

demo: $(DEMO_STAMP) hook     ## run the whole path on simulated GPUs, no cluster (installs only .[demo])
	$(BIN)/gpushare-dra demo
	@echo "gpushare-dra is in $(CURDIR)/$(BIN): export PATH=\"$(CURDIR)/$(BIN):\$$PATH\" (or . $(BIN)/activate)"

# `make test` runs pytest three times. The real cluster's tests (tests/cluster, the two-node ones
# too: one cluster, mostly waiting on it) run beside the tests that mostly wait too (subprocesses,
# gRPC, the API emulator) on TEST_WORKERS pytest-xdist workers, a file per worker at a time, the
# longest files first (tests/conftest.py FIRST; hence --no-loadscope-reorder); both at nice 10 (the
# cluster's processes too, which cluster-up starts from its test). Then, alone on the machine, those
# marked `serial` (tests/conftest.py: shares timed on the simulator, which flake when they wait for
# a core) on SERIAL_WORKERS workers: each uses about a third of a core (10.6 minutes on one worker,
# 5.6-6.3 on two, with no rerun; beside the cluster's last minutes three of them failed, twice),
# those marked `alone` (real-time priority: they would starve the other worker's) last. The
# cluster's lines come as they happen, each led by `cluster|`, its summary last. All parts always
# run; it fails if any did; the parts name their slowest tests (the target: the whole suite under
# 15 minutes warm). `pytest -q` alone runs every test one at a time. `make test-two-nodes` runs the
# two-node tests alone (docs/operations.md, "Two nodes on one machine").
TEST_WORKERS ?= 4
SERIAL_WORKERS ?= 2

test: test-deps tools lint hook  ## the checks and every test suite, as CI runs it (as root: podman and the rest installed)
	status=0; rc=$$(mktemp); \
	{ nice -n 10 $(BIN)/python -m pytest -v -p no:cacheprovider --durations=5 tests/cluster; echo $$? > $$rc; } 2>&1 | \
	    sed -u 's/^/cluster| /' & \
	nice -n 10 $(BIN)/python -m pytest -q -m "not serial" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 \
	    --ignore=tests/cluster || status=$$?; \
	wait; [ "$$(cat $$rc)" = 0 ] || { echo "make test: tests/cluster failed (its lines: cluster|)"; status=1; }; rm -f $$rc; \
	$(BIN)/python -m pytest -q -m "serial and not alone" -n $(SERIAL_WORKERS) --dist loadfile --no-loadscope-reorder \
	    --durations=15 --ignore=tests/cluster || status=$$?; \
	$(BIN)/python -m pytest -q -m alone --durations=5 --ignore=tests/cluster || status=$$?; \
	exit $$status

test-two-nodes: test-deps hook  ## as root: the two-node tests alone (tests/cluster/test_two_nodes.py; make test runs them too)
	$(BIN)/python -m pytest -v -p no:cacheprovider --durations=5 -m two_nodes tests/cluster

lint: $(STAMP)               ## ruff, mypy and the import contracts between the parts (all configured in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test-deps:                   ## as root: apt-install what the container tests need; else say what skips
	@hack/test-deps

tools:                       ## build helm into .cache/tools for the chart's tests (hack/helm, with Go; once)
	@if command -v go >/dev/null; then hack/helm >/dev/null; fi

hook:                        ## build libgpushare.so, the simulated driver and the probe (gcc only)
	$(MAKE) -C hook

# The product image as a docker archive (`docker save`'s format) that podman load, docker load and
# ctr images import read, tagged gpushare-dra:VERSION (pyproject.toml's, the chart's appVersion)
# and gpushare-dra:dev; built without Docker or a registry by hack/cluster/image, as hack/cluster-up does.
image:                       ## as root: dist/gpushare-dra-VERSION.tar, the product image (podman load -i / ctr images import)
	hack/cluster/image product --out $(DIST)

codegen: $(STAMP)            ## regenerate the kubelet gRPC stubs from api/kubelet/*.proto
	PYTHON=$(BIN)/python hack/update-codegen.sh

# `make bench` runs every benchmark, each printing its table. A bench that misses a target it
# prints exits 1 and names the missed ones in its last line (`missed: ...`; hack/benchtargets.py;
# hack/bench-share does not check its targets yet). All run; it fails, naming them, if any failed.
BENCHES := prepare controller hook share agent backstop fleet

bench: $(STAMP) hook         ## print every benchmark table; fails if one missed a target it prints (all run)
	failed=; \
	for b in $(BENCHES); do $(BIN)/python hack/bench-$$b || failed="$$failed bench-$$b"; done; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi

# The demo needs the product and the playground (.[demo]); the checks and tests add the
# development tools (.[test], which includes .[demo]), so a test install serves the demo too.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[demo]'
	touch $@

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(DEMO_STAMP)

clean:
	$(MAKE) -C hook clean
	rm -rf $(VENV) build dist *.egg-info
