#!/bin/sh
# Makes a fresh Debian machine a tidemark node: installs the packages given as arguments (the
# Vagrantfile passes docker/node-packages.txt, the list the container image has), starts sshd,
# and lets the key that logs in as the vagrant user (if there is one) log in as root, since the
# harness runs iptables and nft on the node. Safe to run again.
set -eu
if [ "$#" -eq 0 ]; then
    echo "usage: provision.sh PACKAGE..." >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing
fi
if [ -f /home/vagrant/.ssh/authorized_keys ]; then
    install -d -m 700 /root/.ssh
    touch /root/.ssh/authorized_keys
    while IFS= read -r key; do
        grep -qxF "$key" /root/.ssh/authorized_keys || printf '%s\n' "$key" >> /root/.ssh/authorized_keys
    done < /home/vagrant/.ssh/authorized_keys
    chmod 600 /root/.ssh/authorized_keys
fi
# Without systemd (a container) sshd is started here; with it, the package started it already.
if [ -d /run/systemd/system ]; then
    systemctl enable --now ssh
elif ! pgrep -x sshd >/dev/null; then
    mkdir -p /run/sshd
    [ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
    /usr/sbin/sshd
fi
# What the harness checks on a node, checked here so a broken box fails its provisioning.
for tool in sshd iptables nft faketime ip pkill setsid fusermount3; do
    command -v "$tool" >/dev/null || { echo "provision.sh: $tool is missing" >&2; exit 1; }
done
