#!/usr/bin/env bash
# `make e2e-sglang`: the real-SGLang tier. Creates .venv-sglang (SGLang 0.5.23 for CPU, ~7 GB,
# ~10 min) when missing, writes the `sgl_kernel` stand-in, builds the tiny random Llama with the
# project's tokenizer into .e2e-sglang/, then runs `pytest -m e2e_sglang tests/e2e_sglang`, which
# starts real replicas on free loopback ports and stops them by PID. A tier that cannot install or
# run fails (exit 1, the reason printed): it never passes by skipping, and no test may skip inside
# it (PREFIXGATE_E2E_REQUIRED=1). docs/e2e-sglang.md says why each step.
# Env: PY (python for the venv, default python3), E2E_SKIP_INSTALL=1 (never install: a missing
# .venv-sglang fails at once), PYTEST_ARGS (added to both pytest sessions; a -k there replaces the
# session split, so both run that selection).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-sglang
PY=${PY:-python3}
WORK=.e2e-sglang
STUB=$WORK/stub
mkdir -p "$WORK"

fail() {
    echo "e2e-sglang: FAILED, the real-SGLang tier did not run — $*" >&2
    exit 1
}

# SGLang's declared requirements include CUDA-only packages (flashinfer, cuda-python,
# nvidia-cutlass-dsl, sglang-kernel): the wheel goes in with --no-deps and these, pins kept, by hand.
REQUIREMENTS=(
    "torch==2.14.1" "torchvision==0.29.1"
    aiohttp "anthropic>=0.20.0" "blobfile==3.0.0" build "compressed-tensors==0.18.0" datasets distro
    easydict einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2" "mistral_common>=1.11.5"
    modelscope msgspec ninja "numba==0.65.1" numpy nvidia-ml-py "openai==2.8.0" "openai-harmony==0.0.4"
    orjson "outlines==0.1.11" packaging partial_json_parser pillow "prometheus-client>=0.20.0" psutil
    py-spy pybase64 pydantic "python-dateutil<3" python-multipart "pyzmq>=25.1.2" regex requests scipy
    "sentencepiece==0.2.1" setproctitle "smg-grpc-servicer>=0.9.0" "soundfile==0.13.1" tiktoken
    "tokenizers==0.23.2" tqdm "transformers==5.19.0" "uvicorn>=0.51" uvloop watchfiles "xgrammar==0.2.7"
    xxhash zstandard "apache-tvm-ffi==0.1.11"
)

install_sglang() {
    "$PY" -m venv "$VENV" || return 1
    "$VENV/bin/pip" install -q -U pip || return 1
    "$VENV/bin/pip" download -q --no-deps -d "$WORK/wheels" "sglang==0.5.23" || return 1
    "$VENV/bin/pip" install -q --no-deps "$WORK"/wheels/sglang-0.5.23-*.whl || return 1
    "$VENV/bin/pip" install -q "${REQUIREMENTS[@]}" || return 1
}

# The kernel package ships CUDA-only wheels and no sdist; a tiny Llama on the torch-native backend
# calls none of its functions, but SGLang imports it: every attribute is a function that raises.
write_stub() {
    mkdir -p "$STUB/sgl_kernel"
    cat > "$STUB/sgl_kernel/__init__.py" <<'PY'
"""Stand-in for sgl_kernel (CUDA-only wheels): importable, and any function raises when called."""

__version__ = "0.0.0+prefixgate-stub"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available on CPU (prefixgate e2e stand-in)")

    unavailable.__name__ = name
    return unavailable
PY
}

if [ ! -x "$VENV/bin/python" ]; then
    [ "$(uname -s)" = Linux ] || fail "SGLang's wheels are for Linux only (this is $(uname -s))"
    [ "$(uname -m)" = x86_64 ] || fail "the pinned torch/SGLang wheels are for x86_64 (this is $(uname -m))"
    [ "${E2E_SKIP_INSTALL:-0}" = 1 ] && fail "$VENV is missing and E2E_SKIP_INSTALL=1"
    echo "e2e-sglang: creating $VENV with sglang==0.5.23 (~10 min, ~7 GB; log: $WORK/install.log)"
    if ! install_sglang > "$WORK/install.log" 2>&1; then
        rm -rf "$VENV"
        tail -5 "$WORK/install.log" | sed 's/^/  /'
        fail "could not install sglang==0.5.23 and its CPU requirements (no network or no wheel for this platform); log: $WORK/install.log"
    fi
fi
write_stub
PYTHONPATH="$STUB" "$VENV/bin/python" -c "import sglang.srt.entrypoints.http_server" > "$WORK/import.log" 2>&1 \
    || { tail -5 "$WORK/import.log" | sed 's/^/  /'; fail "$VENV exists but SGLang's server does not import; remove it and rerun make e2e-sglang"; }

echo "e2e-sglang: building the tiny model into $WORK/model"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" tests/e2e/tiny_model.py "$WORK/model" \
    > "$WORK/model.log" 2>&1 || { cat "$WORK/model.log"; exit 1; }

export PREFIXGATE_E2E_MODEL="$PWD/$WORK/model"
export PREFIXGATE_E2E_LOGS="$PWD/$WORK/logs"
export PREFIXGATE_SGLANG_STUB="$PWD/$STUB"
export PREFIXGATE_E2E_REQUIRED=1
# Two sessions, so that at most two replicas (~3 GB each) run at once: radix + noradix, then page16.
rc=0
for selection in "not page16" "page16"; do
    echo "e2e-sglang: running pytest -m e2e_sglang -k '$selection' tests/e2e_sglang (replica logs in $WORK/logs)"
    .venv/bin/python -m pytest -p no:cacheprovider -m e2e_sglang -k "$selection" tests/e2e_sglang -q -rs -s \
        ${PYTEST_ARGS:-} || rc=$?
done
exit "$rc"
