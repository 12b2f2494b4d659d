#!/bin/sh
# Install everything and run crihook for real: a local containerd, crihook in front of it with
# a demo hook chain, one pod through crihook, what happened printed; then serve until Ctrl-C.
set -eu
cd "$(dirname "$0")/.."
sh deploy/setup.sh
exec .venv/bin/python -m tests.lab.demo "$@"
