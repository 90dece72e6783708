#!/usr/bin/env bash
# Checks the Prometheus side of deploy/: rule syntax, the scrape config, and
# the promtool unit tests of every alert. Exits non-zero on any failure.
#
#   bash deploy/check.sh
#
# Needs promtool (Debian/Ubuntu: apt-get install prometheus; or a Prometheus
# release tarball). The consistency checks against the binary (flags, metric
# names, ports) are Go tests: go test ./deploy/
set -euo pipefail
cd "$(dirname "$0")/prometheus"

if ! command -v promtool >/dev/null 2>&1; then
  echo "deploy/check.sh: promtool not found; install it (Debian/Ubuntu: apt-get install prometheus) and re-run" >&2
  exit 1
fi

fail=0
run() {
  echo "+ $*"
  if ! "$@"; then
    echo "deploy/check.sh: FAILED: $*" >&2
    fail=1
  fi
}

run promtool check rules alerts.yaml
run promtool check config prometheus.yml
run promtool test rules alerts_test.yaml

if [ "$fail" -ne 0 ]; then
  echo "deploy/check.sh: FAILED" >&2
  exit 1
fi
echo "deploy/check.sh: OK (alert rules, scrape config and alert unit tests)"
