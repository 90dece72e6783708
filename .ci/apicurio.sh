#!/usr/bin/env bash
# Build Apicurio Registry (test/apicurio/pom.xml: the registry's Quarkus
# application from its Maven Central jars) into the harness's cache, once,
# for the schema-registry tests (test/e2e/schema_test.go, test/harness/
# apicurio.go). Java and Maven come from .ci/kafka.sh, which runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh

pom=test/apicurio/pom.xml
version="$(sed -n '/<parent>/,/<\/parent>/s:.*<version>\(.*\)</version>.*:\1:p' "$pom")"
dest="$cache/apicurio-$version"
[ -f "$dest/app/outboxd-apicurio-runner.jar" ] && exit 0

cache_tmp "$cache" apicurio-build
# Build in a copy: target/ stays out of the work tree.
cp -r test/apicurio/. "$tmp/src"
mvn_quiet -f "$tmp/src/pom.xml" package -DskipTests
mkdir -p "$tmp/app"
mv "$tmp/src/target/lib" "$tmp/app/lib"
mv "$tmp/src/target/outboxd-apicurio-$version-runner.jar" "$tmp/app/outboxd-apicurio-runner.jar"
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/app" "$dest/app"
