#!/usr/bin/env bash
# Install Debian's rabbitmq-server (and Erlang) for the RabbitMQ tests
# (sink/rabbitmq, test/brokers), once. The harness runs its own private node
# on loopback ports (test/harness/rabbitmq.go), so the package's own service
# must not start: a policy-rc.d forbids it for the install.
set -euo pipefail

[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && exit 0

policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  own_policy=1
fi
trap 'if [ -n "$own_policy" ]; then rm -f "$policy"; fi' EXIT

echo "installing: rabbitmq-server"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null
