#!/usr/bin/env bash
# Fetch Debezium Server (io.debezium:debezium-server-dist, the version of
# test/debezium/pom.xml) from Maven Central and unpack it into the harness's
# cache, once, for the bench's Debezium Server columns on NATS JetStream and
# RabbitMQ (test/bench/dbzserver.go; not part of CI's tests). It runs on the
# Temurin 25 JDK (test/harness/dbzserver.go). Maven comes from .ci/kafka.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh

pom=test/debezium/pom.xml
dbz="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$pom")"
dir="$cache/debezium-server-$dbz"
[ -f "$dir/debezium-server-dist-$dbz-runner.jar" ] && exit 0

cache_tmp "$cache" debezium-server-fetch
mvn_quiet dependency:copy -Dartifact="io.debezium:debezium-server-dist:$dbz:tar.gz" -DoutputDirectory="$tmp"
tgz="$tmp/debezium-server-dist-$dbz.tar.gz"
# The Cassandra connectors are not needed: only PostgreSQL is read.
tar -xzf "$tgz" -C "$tmp" --exclude 'debezium-server/connectors'
rm -f "$tgz"
rm -rf "$dir"
mv "$tmp/debezium-server" "$dir"
