#!/bin/sh
# mypy --strict on proxy/, hooks/ and api/h2 (crihook's own HTTP/2). The folders install as
# crihook.* through setuptools' package-dir mapping, which mypy cannot follow, so it checks a
# link tree with that layout.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/crihook"
ln -s "$root"/proxy/_root/*.py "$tree/crihook/"
ln -s "$root/proxy" "$tree/crihook/proxy"
ln -s "$root/hooks" "$tree/crihook/hooks"
ln -s "$root/api" "$tree/crihook/api"
# Not exec: the trap must run to remove the link tree.
MYPYPATH="$tree" "${PYTHON:-.venv/bin/python}" -m mypy -p crihook.proxy -p crihook.hooks -p crihook.api.h2
