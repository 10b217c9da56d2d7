#!/bin/sh
# The tidemark node's entry point. Each container gets its own SSH host key, made at its first
# start (the image carries none), and the key the harness logs in with from
# TIDEMARK_AUTHORIZED_KEY. With arguments it runs them (docker/compose.yaml starts brokers so);
# without, sshd in the foreground, through which the harness deploys and drives the broker.
set -eu
if [ ! -f /etc/ssh/ssh_host_ed25519_key ]; then
    ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
fi
if [ -n "${TIDEMARK_AUTHORIZED_KEY:-}" ]; then
    mkdir -p -m 700 /root/.ssh
    printf '%s\n' "$TIDEMARK_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
fi
if [ "$#" -gt 0 ]; then
    exec "$@"
fi
exec /usr/sbin/sshd -D -e
