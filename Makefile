# fusegrad developer tasks. Needs only python3 (>=3.11, with venv), make and a C compiler.
PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.stamp
# Where the local torch==2.13.0+cpu wheel lives on this kind of machine. Passed explicitly
# so the install does not depend on the user's pip.conf / PIP_FIND_LINKS; without it pip
# would fetch torch 2.13.0 from PyPI with several GB of CUDA packages.
WHEELS   ?= /opt/wheels
PIP_OPTS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
EXTRAS   ?= opencl,test
# pytest-xdist workers; 2 cores on the dev/CI machines. Use N=0 to run in one process.
N        ?= 2
PYTEST_ARGS ?=

.PHONY: venv test demo bench clean

venv: $(STAMP)

# editable_mode=compat: a plain .pth with the repo root, so packages/modules added after
# the install (even fusegrad/__init__.py itself) are importable without reinstalling.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check $(PIP_OPTS) \
		--config-settings editable_mode=compat -e '.[$(EXTRAS)]'
	touch $@

# pytest exit code 5 = "no tests collected": not a failure while the suite is empty.
test: $(STAMP)
	$(PY) -m pytest -q -n $(N) $(PYTEST_ARGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests collected"; rc=0; fi; exit $$rc

demo: $(STAMP)
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) bench/bench_ops.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
