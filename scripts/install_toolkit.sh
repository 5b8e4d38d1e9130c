#!/usr/bin/env bash
# Install rknn-toolkit2 versions for rkpart (CI and developers).
#   scripts/install_toolkit.sh [VERSION ...]     default: 2.3.0 2.3.2 2.5.0
# Honours RKPART_TOOLKITS_DIR (where venvs go) and RKPART_WHEELS_DIR (local torch CPU wheel).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${RKPART_PYTHON:-$here/.venv/bin/python}"
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(2.3.0 2.3.2 2.5.0)
for v in "${versions[@]}"; do
  start=$(date +%s)
  "$py" -c "import sys; from rkpart.compile.toolkits import install_toolkit; install_toolkit(sys.argv[1], progress=print)" "$v"
  echo "rknn-toolkit2 $v ready in $(( $(date +%s) - start )) s"
done
