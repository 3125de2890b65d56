#!/usr/bin/env bash
# The Python SDK's CI step (called by .ci/run): a virtual environment under target/ with the
# pinned tools, the wire types generated from proto/, the debug `switchyard` binary, then
# ruff, mypy --strict and pytest against that binary, and core's conformance kit against the
# Python worker. Every gateway a test starts is killed with the test; the whole pytest process
# group is killed if the step is interrupted.
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
venv="$repo/target/py-venv"
python=${PYTHON:-python3}

"$python" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
  || { echo "sdk/python needs Python 3.10 or newer" >&2; exit 1; }
# The mutual-TLS test issues its certificates with the openssl command.
if ! command -v openssl >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq openssl) >&2
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
timeout 300 "$venv/bin/pip" install --quiet --disable-pip-version-check -r requirements-ci.txt

echo "-- generate switchyard.v1 from proto/"
"$venv/bin/python" generate_proto.py

echo "-- cargo build -p switchyard"
(cd "$repo" && cargo build --locked -p switchyard)
export PYSDK_SWITCHYARD_BIN="$repo/target/debug/switchyard"

echo "-- ruff"
"$venv/bin/ruff" format --check .
"$venv/bin/ruff" check .

echo "-- mypy --strict"
"$venv/bin/mypy"

echo "-- pytest"
setsid timeout --kill-after=10 300 "$venv/bin/pytest" -q -p no:cacheprovider &
pytest_pid=$!
trap 'kill -- -"$pytest_pid" 2>/dev/null || true' EXIT
status=0
wait "$pytest_pid" || status=$?
trap - EXIT
case $status in
  0) ;;
  5) echo "pytest collected no tests: the Python SDK step must run its tests" >&2; exit 1 ;;
  *) echo "pytest failed (exit $status)" >&2; exit "$status" ;;
esac

echo "-- conformance kit against the Python worker (tests/tests/python_worker_conforms.rs)"
(cd "$repo" && PYSDK_PYTHON="$venv/bin/python" timeout 600 \
  cargo test --locked -p switchyard-tests --test python_worker_conforms -- --ignored)
