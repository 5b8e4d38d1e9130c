#!/usr/bin/env bash
# Create/refresh the project virtualenv (.venv) with rkpart and everything the tests need.
# Idempotent and quick when nothing changed. Usage: bash scripts/setup.sh [--no-export]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RKPART_VENV:-.venv}
extras="dev,report,export,ray"
[ "${1:-}" = "--no-export" ] && extras="dev,report,ray"
stamp="$VENV/.rkpart-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$extras"
if [ -f "$stamp" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
echo "setup: installing rkpart[$extras] into $VENV" >&2
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
# torch: the CPU wheel 2.13.0 (on this machine's disk; any other version downloads gigabytes)
if [ "$extras" = "dev,report,export,ray" ]; then
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
fi
"$VENV/bin/python" -m pip install -q -e ".[$extras]"
rm -f "$VENV"/.rkpart-setup-*
touch "$stamp"
echo "setup: done" >&2
