# Sourced by .ci/run: a Python venv with psycopg 3 for the Python inbox example
# (examples/python), which test/inbox's TestTableEffectsExactlyOnce runs; it
# exports OUTBOXD_TEST_PYTHON, the interpreter the test uses. A venv, not pip
# --break-system-packages: Debian's python3 refuses system-wide pip installs
# (PEP 668), and a venv works with any python3. Idempotent.
venv="${OUTBOXD_VENV:-$HOME/.cache/outboxd/venv}"
if ! "$venv/bin/python" -c 'import psycopg' 2>/dev/null; then
  command -v python3 >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
  }
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian ships ensurepip separately.
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q -r examples/python/requirements.txt
fi
export OUTBOXD_TEST_PYTHON="$venv/bin/python"
