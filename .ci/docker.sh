#!/usr/bin/env bash
# Docker engine for the container tests (test/docker, and the harness's
# OUTBOXD_TEST_BACKEND=docker). Idempotent and quiet on success:
#   - installs Debian's docker.io (dockerd, containerd, runc) and debootstrap
#     (local base images) if missing;
#   - builds the buildx and compose CLI plugins from their Go modules if the
#     docker client lacks them (Debian bookworm packages neither; a few
#     minutes, once per machine);
#   - starts dockerd with host networking only (no bridge, no iptables: no
#     container gets a private-range address) unless an engine answers, and
#     waits for it.
# Source it (. .ci/docker.sh) to have a dockerd it started stopped again when
# the calling shell exits; run it (bash .ci/docker.sh) to leave it running.
set -euo pipefail

ci_docker_buildx=v0.38.2
ci_docker_compose=v2.40.3
ci_docker_log=${DOCKERD_LOG:-/var/log/outboxd-dockerd.log}

ci_docker_install() {
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  if ((${#need[@]})); then
    echo "installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  local plugins=/usr/local/lib/docker/cli-plugins tmp
  mkdir -p "$plugins"
  if ! docker buildx version >/dev/null 2>&1; then
    echo "building docker buildx $ci_docker_buildx (Go module, once)"
    tmp=$(mktemp -d)
    GOBIN="$tmp" GOFLAGS=-buildvcs=false go install -ldflags "-s -w -X github.com/docker/buildx/version.Version=$ci_docker_buildx" \
      "github.com/docker/buildx/cmd/buildx@$ci_docker_buildx"
    install -m 0755 "$tmp/buildx" "$plugins/docker-buildx"
    rm -rf "$tmp"
  fi
  if ! docker compose version >/dev/null 2>&1; then
    echo "building docker compose $ci_docker_compose (Go module, once)"
    # compose's go.mod has exclude directives, so `go install mod@version`
    # refuses it: build inside the downloaded module instead.
    local dir
    go mod download "github.com/docker/compose/v2@$ci_docker_compose"
    dir=$(go env GOMODCACHE)/github.com/docker/compose/v2@$ci_docker_compose
    (cd "$dir" && GOFLAGS=-buildvcs=false go build -trimpath \
      -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$ci_docker_compose" \
      -o "$plugins/docker-compose" ./cmd)
  fi
}

# ci_docker_live PID: the process exists and is not a zombie.
ci_docker_live() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

ci_docker_start() {
  if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    return 0
  fi
  # A dockerd or containerd that was killed (e.g. at the end of a previous
  # session) leaves pid files that make the next dockerd refuse to start.
  local f pid
  for f in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
    if [ -f "$f" ]; then
      pid=$(cat "$f" 2>/dev/null || true)
      if [ -z "$pid" ] || ! ci_docker_live "$pid"; then
        rm -f "$f"
      fi
    fi
  done
  setsid dockerd --bridge=none --iptables=false --ip6tables=false >>"$ci_docker_log" 2>&1 </dev/null &
  ci_docker_pid=$!
  for _ in $(seq 1 120); do
    if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$ci_docker_pid" 2>/dev/null; then
      echo "dockerd exited; its log ($ci_docker_log):" >&2
      tail -n 30 "$ci_docker_log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "dockerd did not answer within 60s; its log ($ci_docker_log):" >&2
  tail -n 30 "$ci_docker_log" >&2
  return 1
}

# Stops the dockerd this script started (SIGTERM; it stops its containers).
ci_docker_stop() {
  if [ -n "${ci_docker_pid:-}" ] && kill -0 "$ci_docker_pid" 2>/dev/null; then
    kill "$ci_docker_pid"
    for _ in $(seq 1 60); do
      kill -0 "$ci_docker_pid" 2>/dev/null || return 0
      sleep 0.5
    done
  fi
}

ci_docker_pid=
ci_docker_install
ci_docker_start
if [ "${BASH_SOURCE[0]}" != "$0" ] && [ -n "$ci_docker_pid" ]; then
  trap ci_docker_stop EXIT
fi
