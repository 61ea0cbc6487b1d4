#!/usr/bin/env bash
# Runs run_example.py (its arguments: --shards '0=postgres://...,1=...') in a
# venv holding requirements.txt, made with Debian's Python (python3-venv) on
# first use and refreshed when requirements.txt changes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${SHEAF_PY_VENV:-/var/cache/sheaf/venv}"
if ! cmp -s "$here/requirements.txt" "$venv/requirements.txt"; then
    # /usr/bin/python3 by name: a pyenv or other python3 earlier on PATH may lack venv.
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$venv/requirements.txt"
fi
exec "$venv/bin/python" "$here/run_example.py" "$@"
