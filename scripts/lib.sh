# Shared helpers for the scripts in this directory. Source it; do not run it.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# One cargo target dir on the machine, shared by every checkout: a cache that
# makes warm runs fast. Nothing depends on it: an empty one just builds.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/sheaf/target}"
export PATH="$HOME/.cargo/bin:$PATH"
# The unprivileged user that owns every Postgres cluster (Postgres refuses root).
PG_USER="${SHEAF_PG_USER:-postgres}"

log() { printf '[sheaf] %s\n' "$*" >&2; }
die() { printf '[sheaf] error: %s\n' "$*" >&2; exit 1; }

# pgrx_toml <query>: read pgrx.toml with Python's tomllib (CPython 3.11 is on
# every machine of ours). Queries: majors | pg_config N | field N KEY.
pgrx_toml() {
    python3 - "$ROOT/pgrx.toml" "$@" <<'PY'
import sys, tomllib
cfg = tomllib.load(open(sys.argv[1], "rb"))["versions"]
cmd, args = sys.argv[2], sys.argv[3:]
if cmd == "majors":
    print(" ".join(sorted(cfg, key=int)))
elif cmd == "field":
    major, key = args
    if major not in cfg:
        sys.exit(f"PostgreSQL {major} is not listed in pgrx.toml (listed: {', '.join(sorted(cfg, key=int))})")
    value = cfg[major].get(key, "")
    print(" ".join(value) if isinstance(value, list) else value)
else:
    sys.exit(f"unknown pgrx.toml query {cmd}")
PY
}

pg_config_for() { pgrx_toml field "$1" pg_config; }
bindir_for() { "$(pg_config_for "$1")" --bindir; }

# as_pg CMD...: run a command as the cluster owner.
as_pg() { runuser -u "$PG_USER" -- "$@"; }
