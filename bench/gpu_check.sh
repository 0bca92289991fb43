#!/usr/bin/env bash
# The GPU check: one command for the day a GPU machine is lent, under 8 minutes.
#
#   1. install: the wheels carried in gpu-wheels/ (`make gpu-wheels` here), no index (that host reaches
#      no network), --no-deps, into a folder of their own (--target, then PYTHONPATH) over the host's
#      python with its torch and numpy. Not a --system-site-packages venv: the host's python3 is itself a
#      venv (/opt/torch/.venv), and a venv made from it sees the base interpreter's packages, not torch.
#      This project goes in as a built wheel, so duplex_agent.* maps onto its folders as installed.
#   2. bench.moshi_batch: Moshi 7B's shape, random weights, bf16, CUDA graphs, batch 1 to 64: step
#      p50/p99 against the 80 ms frame and GPU memory per slot.
#   3. duplex-agent serve --plugin moshi --moshi-config 7b-random --no-webrtc, and bench.realtime_load:
#      rounds of N websocket sessions each streaming 80 ms frames in real time; late frames (client
#      side) and frame overruns (the server's /metrics).
#
# Each stage is time-boxed inside the whole budget and prints as it goes (a timeout still leaves
# figures); everything is also written under $OUT (else artifacts/gpu-check/).
#
#   bash bench/gpu_check.sh                                   # on the GPU machine (carry gpu-wheels)
#   bash bench/gpu_check.sh --no-install --python .venv/bin/python --device cpu --tiny \
#        --max-batch 2 --steps 3 --sessions 1,2 --seconds 2     # the dry run (tests/moshi/test_gpu_check.py)
set -u -o pipefail

PY=python3
INSTALL=1
DEVICE=cuda
CONFIG=7b-random
MAX_BATCH=64
STEPS=60
SESSIONS=1,8,32,64
ROUND_SECONDS=15
BUDGET=460
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=$REPO/gpu-wheels
SITE=${TMPDIR:-/tmp}/duplex-gpu-site

usage() { sed -n '2,22p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --python) PY=$2; shift ;;
        --no-install) INSTALL=0 ;;
        --device) DEVICE=$2; shift ;;
        --tiny) CONFIG=tiny ;;
        --max-batch) MAX_BATCH=$2; shift ;;
        --steps) STEPS=$2; shift ;;
        --sessions) SESSIONS=$2; shift ;;
        --seconds) ROUND_SECONDS=$2; shift ;;
        --budget-s) BUDGET=$2; shift ;;
        --wheels) WHEELS=$2; shift ;;
        --site) SITE=$2; shift ;;
        -h|--help) usage 0 ;;
        *) echo "gpu_check: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done

RESULTS=${OUT:-$REPO/artifacts/gpu-check}
mkdir -p "$RESULTS"
LOG=$RESULTS/gpu_check.log
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
STARTED=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - STARTED))); }
# A stage's time box: what it wants, or what is left less what the later stages keep for themselves.
box() { local want=$1 keep=$2 have; have=$(($(left) - keep)); [ "$have" -lt "$want" ] && want=$have; echo "$want"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

say "== gpu check: $(date -u +%FT%TZ), budget ${BUDGET} s, results in $RESULTS"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$LOG"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA",
torch.version.cuda, "GPU seen:", torch.cuda.is_available())' 2>&1 | tee -a "$LOG" || { say "no torch in $PY"; exit 1; }

SERVE_READY=1
if [ "$INSTALL" = 1 ]; then
    say "== install from $WHEELS into $SITE"
    [ -d "$WHEELS" ] || { say "no $WHEELS: run 'make gpu-wheels' where there is network, and carry it"; exit 1; }
    rm -rf "$SITE"
    pip_in() { timeout "$(box 60 300)" "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
        --disable-pip-version-check --find-links "$WHEELS" --target "$SITE" --upgrade "$@" 2>&1 | tee -a "$LOG"; }
    pip_in -r "$REPO/bench/gpu-requirements.txt" || { say "install failed (see above)"; exit 1; }
    if ! pip_in -r "$REPO/bench/gpu-requirements-vad.txt"; then
        SERVE_READY=0
        say "no Silero VAD wheel for this python in $WHEELS (make gpu-wheels GPU_SERVE_PYTHON=X.Y): serve stage skipped"
    fi
    PYTHONPATH=$SITE pip_in --no-build-isolation "$REPO" || { say "installing this project failed (see above)"; exit 1; }
    export PYTHONPATH=$SITE:$REPO  # duplex_agent from the built wheel, bench from the tree
    RUN_DIR=$(mktemp -d)           # not the tree: its duplex_agent/ holds only __init__.py
    AGENT=("$SITE/bin/duplex-agent")
else
    RUN_DIR=$REPO                  # the checkout's venv maps duplex_agent.* onto the tree (editable)
    AGENT=("$(dirname "$PY")/duplex-agent")
fi
[ -x "${AGENT[0]}" ] || AGENT=("$PY" -m duplex_agent.agent.app.cli)
cd "$RUN_DIR" || exit 1
say "install done [$(($(date +%s) - STARTED)) s]"

# ---- 2. the batched frame engine alone ----
say "== bench.moshi_batch: $CONFIG on $DEVICE, batch 1 to $MAX_BATCH, $STEPS steps each"
SIZE=(); [ "$CONFIG" = tiny ] || SIZE=(--full-size)
BENCH_RESULTS="$RESULTS" timeout -k 5 "$(box 220 150)" "$PY" -m bench.moshi_batch "${SIZE[@]}" --device "$DEVICE" --max-batch "$MAX_BATCH" \
    --steps "$STEPS" 2>&1 | tee "$RESULTS/moshi_batch.txt" | tee -a "$LOG"
case $? in
    0) ;;
    124|137) say "bench.moshi_batch: stopped at its time box; the figures above stand" ;;
    *) say "bench.moshi_batch failed (see above)" ;;
esac

# ---- 3. the server under N real-time websocket sessions ----
if [ "$SERVE_READY" = 1 ]; then
    MAX_SESSIONS=$(echo "$SESSIONS" | tr ',' '\n' | sort -n | tail -1)
    PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    say "== duplex-agent serve --plugin moshi --moshi-config $CONFIG --device $DEVICE --max-sessions $MAX_SESSIONS"
    "${AGENT[@]}" serve --plugin moshi --moshi-config "$CONFIG" --device "$DEVICE" --max-sessions "$MAX_SESSIONS" \
        --no-webrtc --sessions-per-minute 0 --drain-timeout 5 --host 127.0.0.1 --port "$PORT" >"$RESULTS/serve.log" 2>&1 &
    SERVER=$!
    trap 'kill $SERVER 2>/dev/null' EXIT
    if timeout "$(box 150 30)" "$PY" - "$PORT" "$SERVER" <<'EOF'
import os, sys, time, urllib.request
port, server = sys.argv[1], int(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
        break
    except OSError:
        os.kill(server, 0)  # the server died: ProcessLookupError ends the wait
        time.sleep(0.5)
EOF
    then
        say "server up [$(($(date +%s) - STARTED)) s]"
        LOAD_BOX=$(box 240 5)
        timeout -k 5 "$LOAD_BOX" "$PY" -m bench.realtime_load --url "http://127.0.0.1:$PORT" --sessions "$SESSIONS" \
            --seconds "$ROUND_SECONDS" --budget-s "$((LOAD_BOX - 5))" --json "$RESULTS/realtime_load.jsonl" 2>&1 \
            | tee "$RESULTS/realtime_load.txt" | tee -a "$LOG"
    else
        say "the server did not come up in time (its log's end follows)"
    fi
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
    tail -n 5 "$RESULTS/serve.log" | tee -a "$LOG"
fi

say "== summary [$(($(date +%s) - STARTED)) s]"
grep -h -E '^(GPU|models built|batch |largest batch|no batch size|N=)' "$RESULTS/moshi_batch.txt" \
    "$RESULTS/realtime_load.txt" 2>/dev/null | tee -a "$LOG"
