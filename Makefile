# fleetcare — two commands matter: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast fuzz lint typecheck bench notebook-html kafka kafka-stop slurm-stop clean

install: $(STAMP)

$(STAMP): pyproject.toml collectors/pyproject.toml pipeline/pyproject.toml models/pyproject.toml api/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e './collectors[nvml,kafka]' -e ./pipeline -e ./models -e ./api -e '.[dev]'
	@# compile the ingest's msgpack decoder now (numba, ~10 s once; cached beside it)
	$(BIN)/python -c "from fleetcare.pipeline import wire_samples; wire_samples.prepare()"
	touch $(STAMP)

demo: install
	$(BIN)/fleetcare demo

# The suite talks to real services: a Kafka broker, a Slurm cluster (slurmctld and
# four slurmd on this host, Debian's packages) and a Prometheus server (Debian's
# package; each test module runs its own instance on loopback), and a headless chromium
# (Debian's, driven by Selenium through chromium-driver) for the dashboard's browser test.
# Two workers (pytest-xdist), a test file each at a time; modules that share the broker
# or the Slurm cluster take a lock on it (tests/conftest.py). TEST_WORKERS=0 runs in one.
TEST_WORKERS ?= 2
test: install
	deploy/kafka/start.sh
	sh deploy/slurm/start.sh
	sh deploy/prometheus/install.sh
	sh deploy/browser/install.sh
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not kafka"

# The ingest fuzz tests with fresh randomness and many more examples than `make test`'s
# 10,000 (derandomized); FUZZ_EXAMPLES=1000000 make fuzz for a long run. The other
# property tests (tests/property.py) run PROPERTY_SCALE times their `make test` count.
FUZZ_EXAMPLES ?= 200000
PROPERTY_SCALE ?= 10
fuzz: install
	FLEETCARE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider tests/pipeline/test_fuzz_ingest.py
	FLEETCARE_PROPERTY_SCALE=$(PROPERTY_SCALE) $(BIN)/python -m pytest -q -p no:cacheprovider tests/pipeline/test_link_summary.py tests/pipeline/test_sample_screen.py tests/pipeline/test_wire_samples.py tests/pipeline/test_wire_columns.py tests/pipeline/test_validate.py

lint: install
	$(BIN)/ruff check collectors pipeline models api tests bench notebooks

typecheck: install
	$(BIN)/mypy -p fleetcare.collectors -p fleetcare.pipeline -p fleetcare.models -p fleetcare.api

bench: install
	$(BIN)/python bench/run_all.py

# The notebooks executed, exported to docs/<name>.html with their source hash (the test
# suite fails when an export is older than its notebook). About a minute on two cores.
notebook-html: install
	$(BIN)/python notebooks/export_html.py

kafka:
	deploy/kafka/start.sh

kafka-stop:
	deploy/kafka/stop.sh

slurm-stop:
	sh deploy/slurm/stop.sh

clean:
	rm -rf $(VENV) .pytest_cache var
