//! The budget of one task's life: what each call of the hot path writes and
//! how many statements it runs, asserted against the table in
//! `docs/benchmarks.md`, so a change that adds a statement or a row version
//! fails here until the table says so.

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use std::collections::BTreeMap;

    use crate::base::plans::take_ran;
    use crate::base::rows::row;
    use crate::testing::{Claimed, claim, enqueue, init, rows, values};
    use pgrx::prelude::*;
    use serde_json::json;

    const DOC: &str = include_str!("../../../docs/benchmarks.md");
    const BEGIN: &str = "<!-- budget: begin -->";
    const END: &str = "<!-- budget: end -->";

    /// Statements a call may run that are not its own: the sweep a claim
    /// runs at most once a second per backend and queue, and the reads of
    /// rows this transaction wrote, which a backend caches only once they
    /// are committed (the test's transaction made the shard and the queue;
    /// in production an enqueue finds both in its backend's cache).
    const AMORTIZED: &[&str] = &[
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = $1 AND state = 'scheduled'",
        "SELECT aging_secs, fairness, notify, xmin FROM queues WHERE name = $1",
        "SELECT shard_id, xmin FROM shard_identity",
    ];

    /// Per table: row versions inserted, updated (of which HOT), deleted.
    fn table_counts() -> BTreeMap<String, [i64; 4]> {
        row! {
            struct Counts {
                relname: String,
                inserted: Option<i64>,
                updated: Option<i64>,
                hot_updated: Option<i64>,
                deleted: Option<i64>,
            }
        }
        rows::<Counts>(
            "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
             FROM pg_stat_xact_user_tables WHERE schemaname = 'sheaf'",
            &[],
        )
        .into_iter()
        .map(|c| {
            let counts = [c.inserted, c.updated, c.hot_updated, c.deleted].map(|n| n.unwrap_or(0));
            (c.relname, counts)
        })
        .collect()
    }

    /// Index entries the task's row in `table` (keyed by `key`) has now:
    /// one per index whose predicate it meets.
    fn entries_of(table: &str, key: &str, task: pgrx::Uuid) -> i64 {
        let predicates: Vec<Option<String>> = values(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indrelid = $1::regclass",
            &[format!("sheaf.{table}").into()],
        );
        predicates
            .iter()
            .map(|p| {
                let sql = format!(
                    "SELECT count(*) FROM sheaf.{table} WHERE {key} = $1 AND ({})",
                    p.as_deref().unwrap_or("true")
                );
                Spi::get_one_with_args::<i64>(&sql, &[task.into()])
                    .expect("predicate")
                    .unwrap_or(0)
            })
            .sum()
    }

    /// What `call` spent, as a row of the budget table, and the statements
    /// it ran; `call` returns the task it wrote.
    fn spent(name: &str, call: impl FnOnce() -> pgrx::Uuid) -> (String, String) {
        let before = table_counts();
        take_ran();
        let task = call();
        let ran = take_ran();
        let after = table_counts();
        let own = ran
            .iter()
            .filter(|sql| !AMORTIZED.iter().any(|a| sql.starts_with(a)))
            .count();
        let delta = |t: &str| -> [i64; 4] {
            let a = after.get(t).copied().unwrap_or_default();
            let b = before.get(t).copied().unwrap_or_default();
            [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]]
        };
        let mut entries = 0;
        let mut cells = Vec::new();
        for (table, key) in [("tasks", "id"), ("ready", "task_id")] {
            let [ins, upd, hot, del] = delta(table);
            // Each new version that is not HOT gets an entry in every index
            // whose predicate it meets (the call writes this task's row only).
            entries += (ins + upd - hot) * entries_of(table, key, task);
            cells.push(format!("{} ({} HOT) / {}", ins + upd, hot, del));
        }
        let others: Vec<String> = after
            .keys()
            .filter(|t| *t != "tasks" && *t != "ready" && delta(t) != [0; 4])
            .cloned()
            .collect();
        assert!(
            others.is_empty(),
            "{name} wrote {others:?} too: the budget counts tasks and ready only; ran {ran:#?}"
        );
        let shown: Vec<String> = ran
            .iter()
            .map(|sql| format!("    {}", sql.chars().take(100).collect::<String>()))
            .collect();
        (
            format!("| {name} | {own} | {} | {} | {entries} |", cells[0], cells[1]),
            format!("{name}:\n{}", shown.join("\n")),
        )
    }

    fn claim_one(queue: &str) -> Claimed {
        let mut c = claim(queue, 1);
        assert_eq!(c.len(), 1, "one task to claim");
        c.remove(0)
    }

    /// Every call of a task's life, and the ones a worker adds, on a queue
    /// past its first use. A mismatch prints the measured table to paste.
    #[pg_test]
    fn the_hot_path_spends_what_the_budget_table_says() {
        init();
        let q = "budget";
        // Warm-up: the queue's row and its band's floor exist, and a task
        // of a lower priority stays behind, as in a queue with a backlog
        // (an enqueue to an empty queue also wakes its listeners).
        enqueue(q, json!({}), json!({"priority": 0}));
        let warm = enqueue(q, json!({}), json!({"priority": 1}));
        let first = claim_one(q);
        assert_eq!(first.id, warm);
        Spi::run_with_args(
            "SELECT sheaf.complete($1, $2)",
            &[warm.into(), first.token.into()],
        )
        .expect("complete");

        let mut rows = vec![spent("enqueue", || enqueue(q, json!({}), json!({"priority": 1})))];
        let (mut task, mut token) = (pgrx::Uuid::from_bytes([0; 16]), 0);
        rows.push(spent("claim", || {
            let claimed = claim_one(q);
            (task, token) = (claimed.id, claimed.token);
            task
        }));
        let call = |sql: &str, task: pgrx::Uuid, token: i64| {
            Spi::run_with_args(sql, &[task.into(), token.into()]).expect(sql);
            task
        };
        rows.push(spent("heartbeat", || {
            call("SELECT sheaf.heartbeat($1, $2)", task, token)
        }));
        rows.push(spent("snooze (0 s: ready again)", || {
            call("SELECT sheaf.snooze($1, $2, '0 s')", task, token)
        }));
        token = claim_one(q).token;
        rows.push(spent("fail (retried now)", || {
            call("SELECT sheaf.fail($1, $2, 'e', '0 s')", task, token)
        }));
        token = claim_one(q).token;
        rows.push(spent("complete", || {
            call("SELECT sheaf.complete($1, $2)", task, token)
        }));

        let begin = DOC.find(BEGIN).expect("docs/benchmarks.md has the budget table") + BEGIN.len();
        let end = DOC.find(END).expect("the budget table ends");
        let documented: Vec<&str> = DOC[begin..end]
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("| ") && !l.starts_with("| call") && !l.starts_with("|-"))
            .collect();
        let measured: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(
            documented,
            measured,
            "docs/benchmarks.md's budget table is not what the calls spend; measured:\n{}\n\nthe statements each ran:\n{}",
            measured.join("\n"),
            rows.iter().map(|r| r.1.as_str()).collect::<Vec<_>>().join("\n")
        );
    }
}
