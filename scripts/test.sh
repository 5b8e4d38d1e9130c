#!/usr/bin/env bash
# Fresh machine -> full test suite: sets up .venv, installs rknn-toolkit2 environments, runs pytest.
# Extra arguments go to pytest (e.g. bash scripts/test.sh -k discovery).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RKPART_TEST_TOOLKITS_DIR=${RKPART_TEST_TOOLKITS_DIR:-$HOME/.cache/rkpart/toolkits}
export RKPART_TOOLKITS_DIR=${RKPART_TOOLKITS_DIR:-$RKPART_TEST_TOOLKITS_DIR}
for v in ${RKPART_TEST_TOOLKIT_VERSIONS:-2.3.0 2.3.2 2.5.0}; do
  .venv/bin/rkpart toolkit install "$v" --toolkits-dir "$RKPART_TEST_TOOLKITS_DIR"
done
# the report's page tests render it in a real headless chromium (Debian's): install it where we may
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq chromium chromium-driver) \
    >/dev/null || echo "test: chromium not installed; the report's browser tests will skip" >&2
fi
# the whole suite writes a few GB under the temporary folder (a passing test's folder is removed at its
# teardown): say how much room there is, so a run that ends in ENOSPC says why in its first lines
df -h "${TMPDIR:-/tmp}" "$HOME" >&2 || true
.venv/bin/ruff check rkpart tests
.venv/bin/mypy
# tests spread over one worker per CPU (at most 4), each module whole on one worker (tests/conftest.py)
exec .venv/bin/python -m pytest -rs --durations=25 -n "${RKPART_TEST_WORKERS:-logical}" --maxprocesses 4 --dist loadscope "$@"
