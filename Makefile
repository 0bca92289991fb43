# make run: install and start the embedded default (reference model, 127.0.0.1:8080).
# make test: install everything the tests need and run them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=

.PHONY: run test bench install install-dev install-moshi omni-venv system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the project's requirements change.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[reference]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[reference,livekit,dev]'
	touch $@ $(VENV)/.installed-run

# Moshi (the `moshi` extra, then the moshi package with --no-deps: its own pins would pull a
# CUDA torch and downgrade aiohttp). With no torch installed, take the CPU wheel of TORCH_VERSION
# (on the project's machines it lies in pip's --find-links folder; a GPU host installs its own
# torch first and keeps it).
MOSHI_VERSION ?= 0.2.13
TORCH_VERSION ?= 2.13.0
$(VENV)/.installed-moshi: pyproject.toml | $(BIN)/python
	$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install --quiet 'torch==$(TORCH_VERSION)'
	$(BIN)/pip install --quiet -e '.[moshi]'
	$(BIN)/pip install --quiet --no-deps 'moshi==$(MOSHI_VERSION)'
	$(BIN)/python -c 'import moshi.models.lm, aiohttp, torch; print("moshi", moshi.__version__, "torch", torch.__version__, "aiohttp", aiohttp.__version__)'
	touch $@

install-moshi: $(VENV)/.installed-moshi

# The real vLLM-Omni 0.30.0 as a test peer (devtools/omni_peer) runs in a venv of its own, rebuilt
# when its pinned requirements change. The whole closure is pinned, so it installs with --no-deps
# (vllm and vllm-omni's own requirements would pull CUDA builds); torch resolves to the CPU wheel.
OMNI_VENV ?= .venv-omni
OMNI_REQUIREMENTS := devtools/omni_peer/requirements.txt
$(OMNI_VENV)/.installed: $(OMNI_REQUIREMENTS)
	rm -rf $(OMNI_VENV)
	$(PYTHON) -m venv $(OMNI_VENV)
	$(OMNI_VENV)/bin/python -m pip install --quiet --no-deps -r $(OMNI_REQUIREMENTS)
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

# Headless Chromium and its driver for the browser tests, espeak-ng for a second voice (Debian packages).
system-deps:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v espeak-ng >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver espeak-ng >/dev/null; \
		else echo "note: chromium, chromedriver or espeak-ng missing and cannot be installed here; tests that need them skip"; fi; \
	fi

run: install
	HF_HUB_OFFLINE=1 $(BIN)/duplex-agent serve --host $(HOST) --port $(PORT)

test: install-dev install-moshi omni-venv system-deps
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: install-dev
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench

clean:
	rm -rf $(VENV) artifacts .pytest_cache frontend/node_modules
