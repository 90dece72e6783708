#!/usr/bin/env bash
# Fetch Debezium's PostgreSQL connector and Kafka Connect (test/debezium/pom.xml)
# into the harness's cache, once, for the parity suite (test/parity). Java and
# Maven come from .ci/kafka.sh, which runs first.
set -euo pipefail
cd "$(dirname "$0")/.."

pom=test/debezium/pom.xml
dbz="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$pom")"
cache="${OUTBOXD_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
libs="$cache/debezium-$dbz/libs"
[ -f "$libs/debezium-connector-postgres-$dbz.jar" ] && exit 0

mkdir -p "$cache/debezium-$dbz"
tmp="$(mktemp -d "$cache/debezium-$dbz/libs-fetch-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# Quiet on success (mvn -q still prints colour codes); everything on failure.
if ! out="$(mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$tmp" 2>&1)"; then
  echo "$out" >&2
  exit 1
fi
rm -rf "$libs"
mv "$tmp" "$libs"
