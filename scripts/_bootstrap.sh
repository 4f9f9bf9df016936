# Sourced by scripts/demo and scripts/test: make sure uv exists, then install the locked
# workspace into .venv. Needs only Python 3.11 and pip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if ! "$PY" -m uv --version >/dev/null 2>&1; then
  echo "bootstrap: installing uv with pip" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check uv
fi
UV=("$PY" -m uv)
# Bytecode ahead of time: where PYTHONDONTWRITEBYTECODE is set (as on CI machines) every worker
# process the tests start would otherwise compile the drivers from source again (botocore alone:
# 2 s of CPU per process).
"${UV[@]}" sync --locked --quiet --compile-bytecode
"${UV[@]}" run --locked --no-sync python -m compileall -q -j 0 core/src contrib/conformance/src adapters/*/src examples/adapter/src tests/selftest >/dev/null
