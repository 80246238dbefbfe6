# fusegrad developer tasks. Needs only python3 (>=3.11, with venv), make and a C compiler.
PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
# Two installs into one venv: the base (numpy, safetensors, tqdm) is all `make demo` needs; `make test` and
# `make bench` add the extras (pyopencl + PoCL, pytest, hypothesis, torch). The test stamp implies
# the base one, so it refreshes both.
BASE_STAMP := $(VENV)/.stamp-base
TEST_STAMP := $(VENV)/.stamp-test
# Where the local torch==2.13.0+cpu wheel lives on this kind of machine. Passed explicitly
# so the install does not depend on the user's pip.conf / PIP_FIND_LINKS; without it pip
# would fetch torch 2.13.0 from PyPI with several GB of CUDA packages.
WHEELS   ?= /opt/wheels
PIP_OPTS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
# editable_mode=compat: a plain .pth with the repo root, so packages/modules added after
# the install (even fusegrad/__init__.py itself) are importable without reinstalling.
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check $(PIP_OPTS) --config-settings editable_mode=compat
EXTRAS   ?= opencl,test
# pytest-xdist workers; 2 cores on the dev/CI machines. Use N=0 to run in one process.
N        ?= 2
PYTEST_ARGS ?=

.PHONY: venv venv-base test test-fast test-ops demo bench gpu-test gpu-bench clean

venv: $(TEST_STAMP)
venv-base: $(BASE_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PIP_INSTALL) -e '.[$(EXTRAS)]'
	touch $@ $(BASE_STAMP)

# everything but the operator matrix's extra variants (each op family's fast cases run): under 10 minutes on 2 cores
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n $(N) $(PYTEST_ARGS) -m "not ops_full" tests

# the unit tier alone (graph, views, lowering, actions, renderers; mostly on the numpy interpreter): under a minute
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -n $(N) $(PYTEST_ARGS) tests/unit

# what `make test` leaves out: the operator matrix's variants (tests/ops, every shape and dtype) and the operator
# tests' OPENCL rows (tests/test_ops.py, tests/test_autograd.py; see tests/conftest.py); CI runs it after `make test`
test-ops: $(TEST_STAMP)
	$(PY) -m pytest -q -n $(N) $(PYTEST_ARGS) -m ops_full tests

demo: $(BASE_STAMP)
	$(PY) examples/digits.py --model mlp

bench: $(TEST_STAMP)
	$(PY) bench/bench_ops.py
	$(PY) bench/bench_train.py

# On a machine with an NVIDIA GPU and its OpenCL driver (the lent device machine: see bench/README.md), with a
# python that has numpy, pytest, torch (CUDA) and pyopencl: the OPENCL device's tests run on the GPU, and the GPU
# benchmark against torch. CI has no GPU: there these tests run on PoCL's CPU driver or skip.
GPU_PY ?= python3
gpu-test:
	$(GPU_PY) -m pytest -q -p no:cacheprovider -k OPENCL tests/test_vectors.py tests/unit/test_actions.py \
	  tests/test_ops.py tests/test_half.py tests/test_fusion.py tests/test_autograd.py tests/test_params.py \
	  tests/test_conv_rows.py tests/test_variables.py tests/unit/test_tc.py tests/unit/test_prefetch.py \
	  tests/test_gpu_rows.py tests/test_gpu_reduce.py

gpu-bench:
	$(GPU_PY) bench/bench_gpu.py --compile

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
