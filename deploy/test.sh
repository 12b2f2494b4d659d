#!/bin/sh
# Install everything and run the whole test suite (as root: the tests start a real containerd).
set -eu
cd "$(dirname "$0")/.."
sh deploy/setup.sh
.venv/bin/python api/generate.py --check
.venv/bin/ruff check proxy hooks api/generate.py tests bench
sh deploy/typecheck.sh
exec .venv/bin/python -m pytest -q "$@"
