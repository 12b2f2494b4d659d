#!/bin/sh
# Install what the runtime test bed (tests/lab: containerd, CRI-O) needs on a Debian/Ubuntu
# machine.
#   sh tests/lab/install.sh        the lab and the test suite's tools
#   sh tests/lab/install.sh lab    only what a lab containerd runs with (deploy/demo.sh)
# Idempotent: when every package is already installed it only runs dpkg-query (well under 1 s).
set -eu

# The lab itself: containerd 1.6, runc, the busybox the images are made of, the CNI plugins,
# gcc and libc6-dev for the pause image, iproute2 for the bridge.
PACKAGES="containerd runc busybox-static containernetworking-plugins gcc libc6-dev iproute2"
if [ "${1:-}" != "lab" ]; then
    # For the peers that tests/lab/peers.py builds: runc's seccomp support links libseccomp
    # (found through pkg-config).
    PACKAGES="$PACKAGES libseccomp-dev pkg-config"
    # CRI-O (tests/lab/crio.py) is built by peers.py; its container monitor is Debian's
    # conmon. Its build needs nothing more: signatures in pure Go and no btrfs driver (build
    # tags), so neither libgpgme-dev nor libbtrfs-dev.
    PACKAGES="$PACKAGES conmon"
    # systemd-analyze, for `systemd-analyze verify` of systemd/ (tests/unit/test_systemd_units.py).
    # Installing the package does not make systemd the init of a container; it only adds files.
    PACKAGES="$PACKAGES systemd"
fi

missing=""
for pkg in $PACKAGES; do
    # "install ok installed" is the only status that means the package is usable.
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [ "$status" != "install ok installed" ]; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "tests/lab/install.sh: missing packages:$missing (run as root to install them)" >&2
    exit 1
fi

echo "tests/lab/install.sh: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086  # word splitting of the package list is intended
apt-get install -y -q --no-install-recommends $missing
# The Debian package ships a systemd unit; without systemd nothing starts it. Where systemd
# exists it may have started a system-wide containerd: harmless, the lab runs its own instance
# on a private socket and root.
