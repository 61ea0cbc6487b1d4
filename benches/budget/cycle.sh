#!/usr/bin/env bash
# The full cycle (enqueue one, claim one, complete it) in plain SQL, sheaf
# beside the textbook queue, driven by pgbench instead of a Rust client: no
# client-side work hides what each call costs the server. Rounds alternate
# between the two systems so both see the same machine; each prints its
# cycles/s and pgbench's per-statement latency.
#
#   benches/budget/cycle.sh URL [--rounds N] [--secs S] [--clients C] [--commit async|durable]
#
# URL: a shard database (sheaf installed and initialised), as its owner.
# It works in queue 'budget-cycle' and schema budget_cycle (dropped at the
# end) with 1,000 tasks pending in each. pgbench comes with the server
# packages (e.g. /usr/lib/postgresql/15/bin). Results: docs/benchmarks.md.
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
url="$1"; shift
rounds=3; secs=5; clients=2; commit=async
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --secs) secs="$2"; shift 2 ;;
        --clients) clients="$2"; shift 2 ;;
        --commit) commit="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$commit" in
    async) sync=off ;;
    durable) sync=on ;;
    *) echo "--commit: async or durable" >&2; exit 2 ;;
esac
bin="$(dirname "$(command -v psql)")"  # the server packages put pgbench beside their psql
pgbench="$bin/pgbench"
[ -x "$pgbench" ] || pgbench="$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1)"
[ -x "$pgbench" ] || { echo "pgbench not found (it comes with the PostgreSQL server packages)" >&2; exit 1; }

work="$(mktemp -d)"
cleanup() {
    rm -rf "$work"
    psql -X -q -d "$url" -c "DROP SCHEMA IF EXISTS budget_cycle CASCADE" \
        -c "SELECT sheaf.drop_queue(name, true) FROM sheaf.queues WHERE name = 'budget-cycle'" >/dev/null 2>&1 || true
}
trap cleanup EXIT

psql -X -q -v ON_ERROR_STOP=1 -d "$url" <<'SQL'
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS budget_cycle CASCADE;
CREATE SCHEMA budget_cycle;
-- The textbook queue of claim-bench (benches/claim/systems.rs).
CREATE TABLE budget_cycle.jobs (id bigserial PRIMARY KEY, queue text NOT NULL, priority integer NOT NULL DEFAULT 0,
    payload jsonb NOT NULL, state text NOT NULL DEFAULT 'pending', run_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(), ckey text, fkey text, locked_by text, locked_at timestamptz);
CREATE INDEX ON budget_cycle.jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX ON budget_cycle.jobs (fkey) WHERE state = 'running';
CREATE INDEX ON budget_cycle.jobs (ckey) WHERE state = 'running';
INSERT INTO budget_cycle.jobs (queue, payload) SELECT 'budget-cycle', '{}' FROM generate_series(1, 1000);
-- A run before this one left its backlog: both sides start from 1,000.
SELECT sheaf.drop_queue(name, true) FROM sheaf.queues WHERE name = 'budget-cycle' \g /dev/null
SELECT count(*) FROM sheaf.enqueue_batch('budget-cycle', array_fill('{}'::jsonb, ARRAY[1000])) \g /dev/null
SQL

cat >"$work/sheaf.sql" <<'SQL'
SELECT sheaf.enqueue('budget-cycle', '{}');
SELECT task_id::text AS tid, token AS tok FROM sheaf.claim('budget-cycle', 'budget', 1) \gset
SELECT sheaf.complete(:tid::uuid, :tok);
SQL
cat >"$work/textbook.sql" <<'SQL'
INSERT INTO budget_cycle.jobs (queue, priority, payload) VALUES ('budget-cycle', 0, '{}');
UPDATE budget_cycle.jobs SET state = 'running', locked_by = 'budget', locked_at = now() WHERE id IN (SELECT id FROM budget_cycle.jobs WHERE queue = 'budget-cycle' AND state = 'pending' AND run_at <= now() ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id AS tid \gset
UPDATE budget_cycle.jobs SET state = 'done' WHERE id = :tid;
SQL

ratios=()
for round in $(seq "$rounds"); do
    declare -A tps=()
    for system in sheaf textbook; do
        out="$(PGOPTIONS="-c synchronous_commit=$sync" "$pgbench" -n -r -M prepared -c "$clients" -j "$clients" \
            -T "$secs" -f "$work/$system.sql" "$url" 2>&1)" || { echo "$out" >&2; exit 1; }
        tps[$system]="$(awk '/^tps/ {printf "%.0f", $3}' <<<"$out")"
        echo "round $round $system: ${tps[$system]} cycles/s; ms per statement:"
        awk '/^ +[0-9.]+ +[0-9]+ +/ {printf "    %s  %s\n", $1, substr($0, index($0, $3), 60)}' <<<"$out"
    done
    ratios+=("$(awk -v a="${tps[sheaf]}" -v b="${tps[textbook]}" 'BEGIN {printf "%.2f", a / b}')")
    unset tps
done
sorted="$(printf '%s\n' "${ratios[@]}" | sort -n)"
echo "sheaf ÷ textbook per round: ${ratios[*]}; median $(awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' <<<"$sorted")" \
     "($commit commit, $clients clients, $secs s rounds)"
