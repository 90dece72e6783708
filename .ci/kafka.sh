#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars the test harness runs (test/kafka/pom.xml)
# into the harness's cache, once: Java 17+ and Maven are installed if missing.
# The version is test/kafka/pom.xml's kafka.version unless
# OUTBOXD_TEST_KAFKA_VERSION names another.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh

version="${OUTBOXD_TEST_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' test/kafka/pom.xml)}"
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
cache_tmp "$cache/kafka-$version" libs-fetch
mvn_quiet -f test/kafka/pom.xml dependency:copy-dependencies -Dkafka.version="$version" -DoutputDirectory="$tmp"
rm -rf "$libs"
mv "$tmp" "$libs"
