# make run: install and start the embedded default (reference model, 127.0.0.1:8080).
# make test: install everything the tests need and run them.
# make livekit-dev: the loopback LiveKit server and `duplex-agent dev` against it.
# make livekit-agents-dev: the same server, the page, and examples/livekit_agents_app.py against it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=
LIVEKIT_PORT ?= 7880
# The venvs are installed by uv, from the index and find-links folder pip is set to use
# here: it unpacks wheels side by side and compiles their bytecode on every core, several times
# faster than pip on torch and vLLM. The bytecode is compiled at install, as pip does, because
# every test process imports these packages afresh. moshi's own pins are not met on purpose (see
# install-moshi), so pip-check below reports any broken requirement but moshi's.
UV_VERSION ?= 0.13.9
UV_VENV := build/uv
UV := $(UV_VENV)/bin/uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
INDEX_URL ?= $(or $(PIP_INDEX_URL),$(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null))
uv_install = $(UV) pip install --quiet --compile-bytecode --python $(1) $(addprefix --find-links ,$(FIND_LINKS)) \
	$(addprefix --index-url ,$(INDEX_URL))
PIP_INSTALL = $(call uv_install,$(BIN)/python)
PIP_CHECK = $(BIN)/python -m pip check | grep -v -e '^moshi ' -e '^No broken requirements' && exit 1 || true

.PHONY: run livekit-dev livekit-agents-dev test test-venv test-venv-lint suite test-fast lint typecheck bench bench-quick figures install install-dev install-moshi omni-venv system-deps clean

$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet 'uv==$(UV_VERSION)'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's requirements change. `run` takes the livekit extra too (about
# 11 s and 130 MB beside the reference model's 880 MB), so `start` and `dev` work after it.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python $(UV)
	$(PIP_INSTALL) -e '.[reference,livekit]'
	@$(PIP_CHECK)
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python $(UV)
	$(PIP_INSTALL) -e '.[reference,livekit,dev]'
	@$(PIP_CHECK)
	touch $@ $(VENV)/.installed-run

# Moshi (the `moshi` extra, then the moshi package with --no-deps: its own pins would pull a
# CUDA torch and downgrade aiohttp). With no torch installed, take the CPU wheel of TORCH_VERSION
# (on the project's machines it lies in pip's --find-links folder; a GPU host installs its own
# torch first and keeps it).
MOSHI_VERSION ?= 0.2.13
TORCH_VERSION ?= 2.13.0
$(VENV)/.installed-moshi: pyproject.toml | $(BIN)/python $(UV)
	$(BIN)/python -c 'import torch' 2>/dev/null || $(PIP_INSTALL) 'torch==$(TORCH_VERSION)'
	$(PIP_INSTALL) -e '.[moshi]'
	$(PIP_INSTALL) --no-deps 'moshi==$(MOSHI_VERSION)'
	@$(PIP_CHECK)
	$(BIN)/python -c 'import moshi.models.lm, aiohttp, torch; print("moshi", moshi.__version__, "torch", torch.__version__, "aiohttp", aiohttp.__version__)'
	touch $@

install-moshi: $(VENV)/.installed-moshi

# The real vLLM-Omni 0.30.0 as a test peer (devtools/omni_peer) runs in a venv of its own, rebuilt
# when its pinned requirements change. The whole closure is pinned, so it installs with --no-deps
# (vllm and vllm-omni's own requirements would pull CUDA builds); torch resolves to the CPU wheel.
OMNI_VENV ?= .venv-omni
OMNI_REQUIREMENTS := devtools/omni_peer/requirements.txt
$(OMNI_VENV)/.installed: $(OMNI_REQUIREMENTS) | $(UV)
	rm -rf $(OMNI_VENV)
	$(PYTHON) -m venv $(OMNI_VENV)
	$(call uv_install,$(OMNI_VENV)/bin/python) --no-deps -r $(OMNI_REQUIREMENTS)
	$(OMNI_VENV)/bin/python -m devtools.omni_peer --check
	touch $@

omni-venv: $(OMNI_VENV)/.installed

# The page's LiveKit mode: livekit-client's browser bundle, pinned by frontend/package-lock.json,
# copied into frontend/vendor/ so that a wheel built from this tree carries it.
frontend/node_modules/.installed: frontend/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix frontend --no-audit --no-fund --loglevel=error \
		&& mkdir -p frontend/vendor && cp frontend/node_modules/livekit-client/dist/livekit-client.umd.js frontend/vendor/ \
		&& touch $@; \
	else echo "note: npm missing; the page's LiveKit mode and its browser test are unavailable"; fi

install: $(VENV)/.installed-run frontend/node_modules/.installed
install-dev: $(VENV)/.installed-dev frontend/node_modules/.installed

# Headless Chromium and its driver for the browser tests, espeak-ng for a second voice, iproute2 for
# network namespaces (Debian packages).
system-deps:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v espeak-ng >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver espeak-ng >/dev/null; \
		else echo "note: chromium, chromedriver or espeak-ng missing and cannot be installed here; tests that need them skip"; fi; \
	fi
	@# ip (iproute2) for the impaired-network tests' namespaces (tests/network, devtools/netem).
	@if ! command -v ip >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; \
		else echo "note: ip (iproute2) missing and cannot be installed here; the impaired-network tests skip"; fi; \
	fi

run: install
	HF_HUB_OFFLINE=1 $(BIN)/duplex-agent serve --host $(HOST) --port $(PORT)

# LiveKit on this machine: the loopback server (keys devkey/secret) on LIVEKIT_PORT, the worker
# in dev mode against it, the page on HOST:PORT; Ctrl-C stops both.
livekit-dev: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m devtools.livekit_dev --livekit-port $(LIVEKIT_PORT) -- --host $(HOST) --port $(PORT)

# The LiveKit Agents example the same way: the loopback server on LIVEKIT_PORT, the page on
# HOST:PORT (its dev tokens dispatch the agent), and examples/livekit_agents_app.py run as
# `python -m livekit.agents start APP --dev` under that agent name; Ctrl-C stops all.
livekit-agents-dev: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m devtools.livekit_dev --livekit-port $(LIVEKIT_PORT) \
		--app examples/livekit_agents_app.py --host $(HOST) --port $(PORT)

# The whole suite runs as two pytest processes side by side (devtools/split_suite.py); with
# PYTEST_ARGS, one pytest run of what they name.
# The installs run side by side where they can: the project's venv (dev extra, then moshi: both
# install into .venv, so one after the other) and then lint and types on it, beside the vLLM-Omni
# venv (the longest install) and the Debian packages. All of it ends before the suite starts: beside
# the suite, a cold mypy's minute of CPU slowed the first real-time tests.
test:
	$(MAKE) --no-print-directory -j3 test-venv-lint omni-venv system-deps
	$(MAKE) --no-print-directory suite

test-venv: install-dev
	$(MAKE) --no-print-directory install-moshi

test-venv-lint: test-venv
	$(MAKE) --no-print-directory lint

suite:
	HF_HUB_OFFLINE=1 $(BIN)/python -m $(if $(PYTEST_ARGS),pytest -q $(PYTEST_ARGS),devtools.split_suite -q)

# The fast tier alone, for the inner loop: every test not in the real-peer tier (tests/conftest.py).
test-fast: install-dev install-moshi
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not realtime" $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck

# mypy on the product packages under the names the wheel installs (duplex_agent.agent, ...), so that
# the types across modules are checked. The folders are mapped under duplex_agent by pyproject's
# [tool.setuptools.package-dir]; mypy reads no such mapping and does not follow setuptools' editable
# finder either (every duplex_agent.* import would be a missing module, Any). So build/typecheck/
# (git-ignored) holds duplex_agent/ as symlinks to the real folders, and mypy finds it there
# ([tool.mypy] mypy_path); the files checked are the tree's own, reported under that prefix, which
# the sed below drops. frontend/ is only its __init__.py (node_modules/ lies beside it).
TYPECHECK_ROOT := build/typecheck/duplex_agent
TYPECHECK_PACKAGES := agent plugins webrtc livekit_agents
typecheck: $(VENV)/.installed-dev
	@rm -rf $(TYPECHECK_ROOT) && mkdir -p $(TYPECHECK_ROOT)/frontend
	@ln -s ../../../duplex_agent/__init__.py $(TYPECHECK_ROOT)/__init__.py
	@ln -s ../../../../frontend/__init__.py $(TYPECHECK_ROOT)/frontend/__init__.py
	@for p in $(TYPECHECK_PACKAGES); do ln -s ../../../$$p $(TYPECHECK_ROOT)/$$p || exit 1; done
	@$(BIN)/mypy -p duplex_agent > build/typecheck/mypy.out; rc=$$?; \
		sed 's|^$(TYPECHECK_ROOT)/||' build/typecheck/mypy.out; exit $$rc

# The scenario benchmarks (bench/__main__.py), each in its own process, each writing
# bench/results/<name>.json; then docs/figures.md and the README's figures from those files.
# bench-quick: each one's --quick form. One needs root (network namespaces) and says so when skipped.
bench: install-dev install-moshi
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench
	$(BIN)/python -m bench.figures

bench-quick: install-dev install-moshi
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench --quick
	$(BIN)/python -m bench.figures

figures: | $(BIN)/python
	$(BIN)/python -m bench.figures

clean:
	rm -rf $(VENV) $(OMNI_VENV) $(UV_VENV) artifacts .pytest_cache frontend/node_modules

# The GPU check (bench/gpu_check.sh) for the day a GPU machine is lent. That machine has torch and
# numpy and no network: gpu-wheels/ carries the rest (about 50 MB: the Moshi bench's wheels and the
# websocket server's, compiled ones for each of GPU_PYTHONS, the 35 MB Silero VAD wheel for
# GPU_SERVE_PYTHON only, so the whole stays under the 64 MiB a device run carries).
GPU_WHEELS ?= gpu-wheels
GPU_PYTHONS ?= 3.11 3.12
GPU_SERVE_PYTHON ?= 3.12
GPU_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1,--platform $(p)_x86_64)

.PHONY: gpu-wheels gpu-check
gpu-wheels: | $(BIN)/python
	for v in $(GPU_PYTHONS); do \
		$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version $$v \
			$(GPU_PLATFORMS) -d $(GPU_WHEELS) -r bench/gpu-requirements.txt || exit 1; \
	done
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
		--python-version $(GPU_SERVE_PYTHON) $(GPU_PLATFORMS) -d $(GPU_WHEELS) -r bench/gpu-requirements-vad.txt
	@du -sh $(GPU_WHEELS)

# On the GPU machine: install from gpu-wheels/, then the batch bench and the websocket load, < 8 min.
gpu-check:
	bash bench/gpu_check.sh
