# raydiff developer entry points. `make demo` and `make test` each set the machine up first
# (virtualenv, pinned packages, dataset) through scripts/setup.sh.
.PHONY: setup demo sweep test coverage test-unit test-learning test-integration test-cluster test-slow test-elastic test-gpu lint format bench bench-data bench-overhead bench-startup bench-sweep bench-sampling bench-sampling-gpu bench-gpu gpu-check gpu-bundle bench-parity data constraints config-doc


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
# but a run where no tier selected anything fails with 5 (a mistyped -k must not pass), and under
# CI (CI set, as .ci/run does) with no PYTEST_ARGS every tier must select tests. Under CI a tier
# whose tests all skipped fails as well, and so does any skip in the slow tier, and so does a tier
# over its wall-time budget (tests/conftest.py, TIER_BUDGETS_S; docs/testing.md#time-budgets).
# The unit tier runs on every core (pytest-xdist); the learning tier trains in one process without
# Ray; the integration and slow tiers share one Ray cluster and run in one process. Each tier lists its 25 slowest tests: where CI's time goes. `make coverage` is
# `make test` that also collects raydiff's line coverage over the tiers together (pytest-cov, the
# pytest processes only) and prints it per package at the end (scripts/coverage_by_package.py;
# `coverage report` gives it per file). `make test` does not measure: it keeps CI's time down.
COV_ARGS =
coverage: COV_ARGS = --cov=raydiff --cov-append --cov-report=
coverage: test
test:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m ruff check . && \
	if [ -n "$(COV_ARGS)" ]; then "$$py" -m coverage erase; fi && \
	case "$${CI:-}" in ""|0|false|no) ci=0;; *) ci=1;; esac && \
	ran=0 && for tier in unit learning integration cluster slow; do \
	  echo "== pytest -m $$tier"; \
	  if [ $$tier = unit ]; then par="-n auto"; else par=""; fi; \
	  "$$py" -m pytest -m $$tier $$par --durations=25 $(COV_ARGS) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ] && [ $$ci -eq 1 ] && [ -z "$(strip $(PYTEST_ARGS))" ]; then \
	    echo "make test: the $$tier tier selected no test under CI" >&2; exit 5; fi; \
	  if [ $$rc -eq 0 ]; then ran=1; elif [ $$rc -ne 5 ]; then exit $$rc; fi; \
	done && \
	if [ $$ran -eq 0 ]; then echo "make test: no tier selected any test" >&2; exit 5; fi && \
	if [ -n "$(COV_ARGS)" ]; then echo "== line coverage of raydiff by package (all tiers)" && \
	  "$$py" scripts/coverage_by_package.py; fi

test-unit:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m unit -n auto $(PYTEST_ARGS)

test-learning:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m learning $(PYTEST_ARGS)

test-integration:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m integration $(PYTEST_ARGS)

test-cluster:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m cluster $(PYTEST_ARGS)

test-slow:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m slow $(PYTEST_ARGS)

# Elastic and preemptible training on a multi-node cluster on this machine (about 3 minutes):
# a node removed, a node added, a preemption notice; the loss per step against one process.
test-elastic:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m elastic -s tests/integration/test_elastic.py $(PYTEST_ARGS)

# The gpu tier (tests/gpu): fp16 and bf16 training steps, NCCL DDP with 2+ GPUs, sampling on a
# GPU actor. Skipped without CUDA; not part of `make test` (CI has no GPU).
test-gpu:
	@py="$$(RAYDIFF_SKIP_DATASET=1 scripts/setup.sh | tail -n 1)" && "$$py" -m pytest -m gpu $(PYTEST_ARGS)

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

# Samples/s of DDIM-50 and 250-step ancestral sampling of the CIFAR-10 hybrid preset on a CUDA GPU,
# batch 256: raydiff eager, compiled and under bf16 autocast against improved-diffusion's sampling
# loops in fp32 and fp16 (needs the .reference/improved-diffusion checkout; about 3 minutes).
bench-sampling-gpu:
	@py="$$(RAYDIFF_SKIP_DATASET=1 scripts/setup.sh | tail -n 1)" && "$$py" bench/sampling.py --gpu $(ARGS)

# Images/s and memory of one training step of the CIFAR-10 hybrid and ImageNet-64 presets on a
# CUDA GPU: raydiff eager, compiled, CUDA graphs and channels-last in fp16 and bf16 against
# improved-diffusion's --use_fp16 step (needs the .reference/improved-diffusion checkout).
bench-gpu:
	@py="$$(RAYDIFF_SKIP_DATASET=1 scripts/setup.sh | tail -n 1)" && "$$py" bench/gpu_step.py $(ARGS)

# Every GPU check in one command of under 10 minutes (docs/testing.md#on-a-gpu), with the
# machine's own python3; gpu-bundle packs Ray and the rest for a GPU machine with no network.
gpu-check:
	@bash bench/gpu_check.sh

gpu-bundle:
	@scripts/gpu_bundle.sh

# Training parity on the CPU: improved-diffusion's own TrainLoop and raydiff's loop train the same
# small Fashion-MNIST UNet on the same batches, 3 seeds x 2000 steps each; loss curves and val
# bits/dim compared against the seed-to-seed spread (needs the .reference/improved-diffusion
# checkout; hours on 2 cores). ARGS="--steps 60 --seeds 0,1" for a short run.
bench-parity:
	@py="$$(scripts/setup.sh | tail -n 1)" && "$$py" bench/training_parity.py $(ARGS)

# docs/configuration.md from the config dataclasses' field docstrings (tests/unit/
# test_configuration_doc.py fails when it is out of date). Needs no dataset.
config-doc:
	@py="$$(RAYDIFF_SKIP_DATASET=1 scripts/setup.sh | tail -n 1)" && "$$py" -m raydiff.config_doc --output docs/configuration.md
