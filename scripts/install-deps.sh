#!/bin/sh
# Create the project's virtual environment and install what kfit needs.
#
# torch comes first and is chosen for the machine, because a plain
# `pip install torch` on Linux downloads the multi-gigabyte CUDA build:
#   TORCH_SPEC set        -> exactly that (your own CUDA / ROCm / nightly build)
#   NVIDIA GPU (nvidia-smi) -> PyPI's default Linux wheel, which is the CUDA build
#   AMD GPU (rocminfo)    -> the ROCm wheel from download.pytorch.org
#   otherwise             -> a local wheel if pip's find-links has one, else the CPU wheel
set -eu
exec 1>&2  # progress goes to stderr: 'make plan FORMAT=json > plan.json' must hold only JSON
venv=${1:-.venv}
python=${2:-python3}
version=${TORCH_VERSION:-2.13.0}
pip="$venv/bin/pip"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$pip" --version >/dev/null

if "$venv/bin/python" -c "import torch" 2>/dev/null && [ -z "${TORCH_SPEC:-}" ]; then
    echo "torch already installed: $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
elif [ -n "${TORCH_SPEC:-}" ]; then
    echo "Installing torch as TORCH_SPEC says: $TORCH_SPEC"
    # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options such as --index-url
    "$pip" install -q $TORCH_SPEC
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "NVIDIA GPU found: installing the CUDA build of torch $version"
    "$pip" install -q "torch==$version"
elif command -v rocminfo >/dev/null 2>&1 && rocminfo >/dev/null 2>&1; then
    index=${TORCH_ROCM_INDEX:-https://download.pytorch.org/whl/rocm6.4}
    echo "AMD GPU found: installing the ROCm build of torch $version from $index"
    "$pip" install -q "torch==$version" --index-url "$index"
elif "$pip" install -q --no-index --no-deps "torch==$version" 2>/dev/null; then
    # A wheel in pip's find-links (checked offline, so nothing large is downloaded);
    # its small pure-Python dependencies come from the index as usual.
    echo "No GPU: installing torch $version from a local wheel"
    "$pip" install -q "torch==$version"
elif [ "$(uname -s)" = Darwin ]; then
    echo "macOS: installing torch $version (CPU and Apple MPS)"
    "$pip" install -q "torch==$version"
else
    echo "No GPU: installing the CPU build of torch $version"
    "$pip" install -q "torch==$version" --index-url https://download.pytorch.org/whl/cpu
fi

# Nothing below may replace the torch chosen above (a package asking for another torch fails instead).
constraint="$venv/torch-constraint.txt"
"$venv/bin/python" -c "import torch; print('torch==' + torch.__version__)" > "$constraint"
"$pip" install -q -c "$constraint" -r requirements.txt -r requirements-test.txt
# The checkout itself, editable: `import kfit` and the `kfit` command in this environment are lib/ as it is
# edited (README's Python example runs as written); --no-deps: the requirements are in already.
"$pip" install -q --no-deps -e .
# A package pip records as installed but whose files were removed is not reinstalled by pip: say what to do.
if ! missing=$("$venv/bin/python" -c "import kconfiglib, torch, safetensors, optuna, sqlalchemy, numpy, psutil, jinja2, tqdm, pynvml, torchmetrics, hypothesis, kfit" 2>&1); then
    echo "error: $venv is incomplete after installing ($(printf '%s\n' "$missing" | tail -n 1)): remove it with 'rm -rf $venv' and run make again"
    exit 1
fi
touch "$venv/.installed"
echo "Environment ready in $venv"
