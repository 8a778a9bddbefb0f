# The two commands of the README: `make run` (set up, then the main job) and `make test`.
VENV ?= .venv
RESULTS ?= results
NATIVE_SOURCES := $(shell find agents sim -name '*.[chS]' -o -name '*.ld' -o -name '*.cpp' -o -name '*.hpp' -o -name CMakeLists.txt 2>/dev/null)

.PHONY: setup setup-all run test check clean
# `make run` installs what the main job needs (host, partition, QEMU guest); `make test` everything else
# too (every environment kind, reference tools, Chromium); a kind's first use in `rtvirt run` brings its part.
setup: $(VENV)/.installed
setup-all: $(VENV)/.installed-all

$(VENV)/.installed: pyproject.toml CMakeLists.txt scripts/setup.sh $(NATIVE_SOURCES)
	VENV=$(VENV) scripts/setup.sh main
	touch $@

$(VENV)/.installed-all: pyproject.toml CMakeLists.txt scripts/setup.sh $(NATIVE_SOURCES)
	VENV=$(VENV) scripts/setup.sh all
	touch $@ $(VENV)/.installed

run: setup
	$(VENV)/bin/rtvirt run default --out $(RESULTS)

# independent tests on several workers (pytest-xdist): timed runs and guest boots overlap (2 cores: more workers
# only help where tests wait; 4 pushed TCG boots past 90 s at host load 16); tests sharing a set-up stay on one
# worker (the groups of tests/conftest.py). Tests that need the machine to themselves (marked quiet: timings
# compared on a CPU, machine-wide host tuning) run afterwards, one at a time; both phases always run, and make
# test fails if either did.
TEST_WORKERS ?= 3
test: setup-all
	status=0; \
	$(VENV)/bin/python -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup -m "not quiet" || status=$$?; \
	$(VENV)/bin/python -m pytest -q -ra --durations=15 -m quiet || status=$$?; \
	exit $$status

check: setup-all
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src

clean:
	rm -rf build $(VENV) .pytest_cache
