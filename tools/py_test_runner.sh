#!/usr/bin/env bash
# Runs one pytest file under the project's Python environment (see tools/py_test.bzl).
# Arguments: the test file, then NAME=path pairs exported as environment variables.
set -euo pipefail
runfiles=${TEST_SRCDIR:?run under bazel test}
cfg=""
for candidate in "$runfiles/python_venv/pyvenv.cfg" "$runfiles/ckpt/external/python_venv/pyvenv.cfg"; do
  [[ -e $candidate ]] && cfg=$(readlink -f "$candidate") && break
done
if [[ -z $cfg ]]; then
  echo "py_test_runner: the project's Python environment is missing; run tools/install_deps.sh" >&2
  exit 1
fi
python=$(dirname "$cfg")/bin/python
test_file=$1
shift
for pair in "$@"; do
  name=${pair%%=*}
  value=${pair#*=}
  # Binaries become absolute paths, so a test may change directory.
  [[ -e $value ]] && value=$(cd "$(dirname "$value")" && pwd)/$(basename "$value")
  export "$name=$value"
done
# The workspace root, and python/ for the `ckpt` package (python/BUILD.bazel).
export PYTHONPATH="$runfiles/ckpt:$runfiles/ckpt/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
xml=()
[[ -n ${XML_OUTPUT_FILE:-} ]] && xml=(--junitxml="$XML_OUTPUT_FILE")
exec "$python" -m pytest -q -p no:cacheprovider "${xml[@]}" "$test_file"
