#!/bin/sh
# make validate-gpu on a bare GPU machine: python3 and a CUDA torch are installed, none of kfit's
# other packages are, and there may be no package index. Run it from a copy of the working tree:
#
#   scripts/validate-gpu-bare.sh              # full run; the JSON goes to docs/validation/
#   QUICK=1 scripts/validate-gpu-bare.sh      # a shorter run (fewer cases)
#
# It makes a virtual environment that sees the machine's own torch (--system-site-packages),
# installs requirements.txt less torch (and less EXCLUDE) from .whl/ when that holds wheels
# (pip --no-index --find-links .whl: no network needed), else from the index, then runs
# scripts/validate_gpu.py. See docs/validation/README.md for preparing .whl/.
#   PYTHON=python3 (a Python inside a virtual environment, such as /opt/torch/.venv/bin/python3: kfit's
#   packages go into that environment)  VENV=.venv-validate  EXCLUDE="torch"  (e.g. EXCLUDE="torch optuna jinja2":
#   validation imports neither, which keeps .whl/ small)  DEVICE= OUT= QUICK= reach the script.
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=${VENV:-.venv-validate}
exclude=${EXCLUDE:-torch}

if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "error: $python has no torch that sees a CUDA GPU: install the machine's CUDA build of torch first" >&2
    exit 2
fi
if "$python" -c "import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)"; then
    # the machine's torch lives in a virtual environment (e.g. /opt/torch/.venv): a new one made with
    # --system-site-packages would see the base interpreter's packages, not it, so kfit's go into that one
    vpython=$python
else
    [ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
    vpython=$venv/bin/python
fi

reqs=$(mktemp)
pattern=$(printf '%s\n' $exclude | sed 's/.*/^[[:space:]]*&([[:space:]=<>!~;[]|$)/' | paste -sd'|' -)
grep -v -i -E "$pattern" requirements.txt > "$reqs"
if ls .whl/*.whl >/dev/null 2>&1; then
    echo "Installing $(grep -c -v -E '^[[:space:]]*(#|$)' "$reqs") requirement(s) from .whl/ (no index)"
    "$vpython" -m pip install -q --no-index --find-links .whl -r "$reqs"
else
    echo "Installing $(grep -c -v -E '^[[:space:]]*(#|$)' "$reqs") requirement(s) from the package index"
    "$vpython" -m pip install -q -r "$reqs"
fi
"$vpython" -c "import torch; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) from {torch.__file__}')"
exec "$vpython" scripts/validate_gpu.py
