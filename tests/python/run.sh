#!/usr/bin/env bash
# Runs the Python wire-compatibility tests against the published client libraries.
#
#   AGENTRY_FIXTURES=path/to/fixtures.json bash tests/python/run.sh
#
# VENV (default: target/py-venv, relative to the repo root) holds a virtualenv
# built from tests/python/requirements.txt. It is rebuilt whenever the hash of
# requirements.txt differs from the stamp stored inside it.
set -euo pipefail

caller_dir="$PWD"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"

python="${PYTHON:-python3}"
venv="${VENV:-target/py-venv}"
requirements="tests/python/requirements.txt"
stamp="$venv/.requirements.sha256"

# The tests run from the repo root; keep a relative fixture path meaning what
# it meant where the caller typed it.
if [[ -n "${AGENTRY_FIXTURES:-}" && "${AGENTRY_FIXTURES}" != /* ]]; then
    AGENTRY_FIXTURES="$caller_dir/$AGENTRY_FIXTURES"
fi
if [[ -n "${AGENTRY_FIXTURES:-}" ]]; then
    export AGENTRY_FIXTURES
fi

want_hash="$("$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$requirements")"
have_hash="$(cat "$stamp" 2>/dev/null || true)"

if [[ ! -x "$venv/bin/python" || "$have_hash" != "$want_hash" ]]; then
    if [[ -e "$venv" ]]; then
        if [[ ! -f "$venv/pyvenv.cfg" ]]; then
            echo "run.sh: refusing to replace $venv: it exists but is not a virtualenv" >&2
            exit 1
        fi
        rm -rf "$venv"
    fi
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$requirements"
    echo "$want_hash" >"$stamp"
fi

exec "$venv/bin/python" -m unittest discover -s tests/python -p 'test_*.py' -v
