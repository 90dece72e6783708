# Sourced by the .ci scripts that fetch or build into the harness's cache
# (kafka.sh, debezium.sh, debezium-server.sh, apicurio.sh), after their cd
# to the repository root.

# The harness's cache: test/harness looks in the same place.
cache="${OUTBOXD_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"

# cache_tmp DIR PREFIX: sets tmp to a new directory DIR/PREFIX-XXXXXX (DIR
# is created): inside the cache, so that what is built there moves into
# place with mv. Every one is removed when the script exits.
ci_tmps=()
trap 'rm -rf ${ci_tmps[@]+"${ci_tmps[@]}"}' EXIT
cache_tmp() {
  mkdir -p "$1"
  tmp="$(mktemp -d "$1/$2-XXXXXX")"
  ci_tmps+=("$tmp")
}

# mvn_quiet ARGS...: mvn -q -B ARGS, quiet on success (mvn -q still prints
# colour codes), and on failure everything it printed, then exit 1.
mvn_quiet() {
  local out
  if ! out="$(mvn -q -B "$@" 2>&1)"; then
    echo "$out" >&2
    exit 1
  fi
}
