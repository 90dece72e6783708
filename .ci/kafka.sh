#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars the test harness runs (test/kafka/pom.xml)
# into the harness's cache, once: Java 17+ and Maven are installed if missing.
# The version is test/kafka/pom.xml's kafka.version unless
# OUTBOXD_TEST_KAFKA_VERSION names another.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${OUTBOXD_TEST_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' test/kafka/pom.xml)}"
cache="${OUTBOXD_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
libs="$cache/kafka-$version/libs"
[ -f "$libs/kafka_2.13-$version.jar" ] && exit 0

need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$cache/kafka-$version"
tmp="$(mktemp -d "$cache/kafka-$version/libs-fetch-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# Quiet on success (mvn -q still prints colour codes); everything on failure.
if ! out="$(mvn -q -B -f test/kafka/pom.xml dependency:copy-dependencies -Dkafka.version="$version" -DoutputDirectory="$tmp" 2>&1)"; then
  echo "$out" >&2
  exit 1
fi
rm -rf "$libs"
mv "$tmp" "$libs"
