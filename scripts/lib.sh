# Shared helpers for the scripts in this directory. Source it; do not run it.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# One cargo target dir on the machine, shared by every checkout: a cache that
# makes warm runs fast. Nothing depends on it: an empty one just builds.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/sheaf/target}"
# Incremental state is per checkout path: every clean clone CI builds in
# would add gigabytes to the shared dir and none of it is reused.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export PATH="$HOME/.cargo/bin:$PATH"
# The unprivileged user that owns every Postgres cluster (Postgres refuses root).
PG_USER="${SHEAF_PG_USER:-postgres}"
# promtool, unpacked by scripts/bootstrap (the alert rules' checks and tests read it).
export SHEAF_PROMTOOL="${SHEAF_PROMTOOL:-/opt/prometheus/usr/bin/promtool}"

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

# The workspace version ([workspace.package] version in Cargo.toml): the
# version HEAD's library reports and the default_version it installs.
workspace_version() {
    python3 - "$ROOT/Cargo.toml" <<'PY'
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["workspace"]["package"]["version"])
PY
}

# releases: one `<version> <commit>` line per release recorded in
# releases.toml, oldest first. Empty while nothing is released.
releases() {
    python3 - "$ROOT/releases.toml" <<'PY'
import re, sys, tomllib
try:
    recorded = tomllib.load(open(sys.argv[1], "rb")).get("releases", {})
except FileNotFoundError:
    recorded = {}
for version, commit in recorded.items():
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        sys.exit(f"releases.toml: {version!r} is not a version X.Y.Z")
    if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit)):
        sys.exit(f"releases.toml: release {version} must name a full 40-hex commit, got {commit!r}")
key = lambda v: tuple(int(p) for p in v.split("."))
for version in sorted(recorded, key=key):
    print(version, recorded[version])
PY
}

# version_lt A B: true when version A sorts before version B.
version_lt() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]; }
