#!/bin/sh
# crihook for real on this machine: a local containerd, crihook in front of it with the
# resource and device hooks, pods through it as kubelet would, what containerd and the kernel
# have printed after each step; then serve until Ctrl-C. Installs only what it uses (Debian's
# containerd, runc, busybox, CNI plugins and gcc, and .venv): no Go peers.
set -eu
cd "$(dirname "$0")/.."
sh deploy/setup.sh --demo
exec .venv/bin/python -m tests.lab.demo "$@"
