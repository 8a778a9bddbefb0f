# The two commands of the README: `make run` (set up, then the main job) and `make test`.
VENV ?= .venv
RESULTS ?= results
NATIVE_SOURCES := $(shell find agents sim -name '*.[ch]' -o -name '*.cpp' -o -name '*.hpp' -o -name CMakeLists.txt 2>/dev/null)

.PHONY: setup run test check clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml CMakeLists.txt scripts/setup.sh $(NATIVE_SOURCES)
	VENV=$(VENV) scripts/setup.sh
	touch $@

run: setup
	$(VENV)/bin/rtvirt run default --out $(RESULTS)

test: setup
	$(VENV)/bin/python -m pytest -q -ra

check: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src

clean:
	rm -rf build $(VENV) .pytest_cache
