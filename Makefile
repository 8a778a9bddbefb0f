# The two commands of the README: `make run` (set up, then the main job) and `make test`.
VENV ?= .venv
RESULTS ?= results
NATIVE_SOURCES := $(shell find agents sim -name '*.[ch]' -o -name '*.cpp' -o -name '*.hpp' -o -name CMakeLists.txt 2>/dev/null)

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

test: setup-all
	$(VENV)/bin/python -m pytest -q -ra

check: setup-all
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src

clean:
	rm -rf build $(VENV) .pytest_cache
