# raydiff developer entry points. `make demo` and `make test` each set the machine up first
# (virtualenv, pinned packages, dataset) through scripts/setup.sh.
.PHONY: setup demo sweep test test-unit test-integration test-slow lint format bench bench-data bench-overhead bench-startup bench-sweep bench-sampling data constraints config-doc


setup:
	@scripts/setup.sh >/dev/null

demo:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" jobs/train.py $(ARGS)

# The demo sweep (configs/sweep_demo.yaml): a new folder each time; `raydiff sweep --resume DIR`
# continues an interrupted one.
SWEEP_OUT ?= runs/sweep_demo-$(shell date +%Y%m%d-%H%M%S)
sweep:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" jobs/sweep.py --config configs/sweep_demo.yaml --output $(SWEEP_OUT) $(ARGS)

# Lint, then the tiers from fastest to slowest (markers from tests/conftest.py); the first failing
# step stops the run, so a broken unit test fails in seconds. pytest exits 5 when a tier selects
# no test (e.g. PYTEST_ARGS=-k that matches only in another tier): that tier counts as passed,
# but a run where no tier selected anything fails with 5 (a mistyped -k must not pass). Each tier
# lists its 25 slowest tests: where CI's time goes.
test:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m ruff check . && \
	ran=0 && for tier in unit integration slow; do \
	  echo "== pytest -m $$tier"; \
	  "$$py" -m pytest -m $$tier --durations=25 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 0 ]; then ran=1; elif [ $$rc -ne 5 ]; then exit $$rc; fi; \
	done && \
	if [ $$ran -eq 0 ]; then echo "make test: no tier selected any test" >&2; exit 5; fi

test-unit:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m unit $(PYTEST_ARGS)

test-integration:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m integration $(PYTEST_ARGS)

test-slow:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m slow $(PYTEST_ARGS)

lint:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m ruff check . && "$$py" -m ruff format --check .

format:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m ruff format . && "$$py" -m ruff check --fix .

bench:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/core_step.py

constraints:
	@py="$$(scripts/setup.sh | tail -n 1)" && { \
	  echo "# Exact versions used for development and CI (pip install -c constraints.txt ...)."; \
	  echo "# pyproject.toml keeps loose lower bounds for users. Regenerate with: make constraints"; \
	  "$$py" -m pip freeze --exclude-editable | sed -E 's/^torch==([0-9.]+)\+cpu$$/torch==\1/'; \
	} > constraints.txt

data:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" jobs/prepare.py fashion-mnist --out data/fashion-mnist

bench-data:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/data_ingest.py

bench-overhead:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/train_overhead.py

bench-startup:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/train_startup.py $(ARGS)

bench-sweep:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/sweep_overhead.py $(ARGS)

bench-sampling:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/sampling.py $(ARGS)

# docs/configuration.md from the config dataclasses' field docstrings (tests/unit/
# test_configuration_doc.py fails when it is out of date). Needs no dataset.
config-doc:
	@py="$$(RAYDIFF_SKIP_DATASET=1 scripts/setup.sh | tail -n 1)" && "$$py" -m raydiff.config_doc --output docs/configuration.md
