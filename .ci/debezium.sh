#!/usr/bin/env bash
# Fetch Debezium's PostgreSQL connector and Kafka Connect (test/debezium/pom.xml),
# the OpenTelemetry Java jars of its otel profile (the parity suite's tracing
# test puts them on Connect's classpath) and Apicurio Registry's Avro converter of
# its apicurio profile (the parity suite's Avro test), into the harness's cache, once, for the
# parity suite (test/parity). Java and Maven come from .ci/kafka.sh, which runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh

pom=test/debezium/pom.xml
dbz="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$pom")"
otel="$(sed -n 's:.*<otel.version>\(.*\)</otel.version>.*:\1:p' "$pom")"
apicurio="$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$pom")"

# fetch DIR MARKER [MVN-ARGS...]: copy the pom's dependencies into
# $cache/DIR/libs unless MARKER is there (test/harness/apachelibs.go's layout).
fetch() {
  local dir="$cache/$1" marker="$2"
  shift 2
  [ -f "$dir/libs/$marker" ] && return 0
  local tmp
  cache_tmp "$dir" libs-fetch
  mvn_quiet -f "$pom" "$@" dependency:copy-dependencies -DoutputDirectory="$tmp"
  rm -rf "$dir/libs"
  mv "$tmp" "$dir/libs"
}

fetch "debezium-$dbz" "debezium-connector-postgres-$dbz.jar"
fetch "opentelemetry-java-$otel" "opentelemetry-exporter-sender-jdk-$otel.jar" -P otel -DincludeGroupIds=io.opentelemetry
fetch "apicurio-converter-$apicurio" "apicurio-registry-utils-converter-$apicurio.jar" -P apicurio \
  -DincludeGroupIds=io.apicurio,org.apache.avro,org.apache.commons,javax.ws.rs
