//! Operator listings: validate, read, return. Nothing here writes.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::excerpt::{excerpt, quoted};
use sheaf_core::listing::{DeadAnchor, TaskAnchor};
use sheaf_core::state::TaskState;

use crate::base::args::{page_rows, required};
use crate::base::errors::{bad_argument, not_found};
use crate::base::jsonb::Jsonb;
use crate::queue::{cancel, enqueue, listing, queues};

/// The most rows one page of a listing returns.
const MAX_PAGE: i32 = 1000;

/// 0.2.0's `get_task`, without `started_at`: kept for a 0.2.0 catalog
/// served by this library until `ALTER EXTENSION sheaf UPDATE` (no SQL of
/// its own: a fresh install has `get_task_started`'s).
#[pg_extern(sql = false, stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn get_task(
    task_id: Option<pgrx::Uuid>,
) -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(kind, String),
        name!(state, String),
        name!(priority, i32),
        name!(attempts, i32),
        name!(max_attempts, i32),
        name!(run_at, Option<TimestampWithTimeZone>),
        name!(enqueued_at, TimestampWithTimeZone),
        name!(concurrency_key, Option<String>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
        name!(last_error, Option<String>),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(payload, pgrx::JsonB),
        name!(lease_owner, Option<String>),
        name!(idempotency_key, Option<String>),
        name!(fairness_key, Option<String>),
        name!(dead_at, Option<TimestampWithTimeZone>),
        name!(progress, Option<pgrx::JsonB>),
    ),
> {
    TableIterator::once(task(task_id).0)
}

/// One task, or its dead letter (state `dead`): what `list_tasks` shows
/// (and its queue; a column is never named like an argument),
/// and its payload, lease owner, idempotency and fairness keys, when it
/// was dead-lettered, its last progress report, and when its running
/// attempt was claimed (`started_at`, NULL unless it is running). A
/// completed task is not kept: P0002 (a cancelled one says so).
#[pg_extern(name = "get_task", stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn get_task_started(
    task_id: Option<pgrx::Uuid>,
) -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(kind, String),
        name!(state, String),
        name!(priority, i32),
        name!(attempts, i32),
        name!(max_attempts, i32),
        name!(run_at, Option<TimestampWithTimeZone>),
        name!(enqueued_at, TimestampWithTimeZone),
        name!(concurrency_key, Option<String>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
        name!(last_error, Option<String>),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(payload, pgrx::JsonB),
        name!(lease_owner, Option<String>),
        name!(idempotency_key, Option<String>),
        name!(fairness_key, Option<String>),
        name!(dead_at, Option<TimestampWithTimeZone>),
        name!(progress, Option<pgrx::JsonB>),
        name!(started_at, Option<TimestampWithTimeZone>),
    ),
> {
    let (
        (
            queue,
            kind,
            state,
            priority,
            attempts,
            max_attempts,
            run_at,
            enqueued_at,
            concurrency_key,
            lease_expires_at,
            last_error,
            execution_id,
            payload,
            lease_owner,
            idempotency_key,
            fairness_key,
            dead_at,
            progress,
        ),
        started_at,
    ) = task(task_id);
    TableIterator::once((
        queue,
        kind,
        state,
        priority,
        attempts,
        max_attempts,
        run_at,
        enqueued_at,
        concurrency_key,
        lease_expires_at,
        last_error,
        execution_id,
        payload,
        lease_owner,
        idempotency_key,
        fairness_key,
        dead_at,
        progress,
        started_at,
    ))
}

/// The task `task_id` (or its dead letter) on this shard; P0002 if none.
fn task(task_id: Option<pgrx::Uuid>) -> listing::Started {
    let id = required(task_id, "task_id");
    match listing::get(id) {
        Some(task) => task,
        None => match cancel::cancelled(id) {
            Some(reason) => not_found(format_args!(
                "task {id} was cancelled{}: cancelled tasks are not kept",
                reason.map_or(String::new(), |r| format!(" ({})", quoted(&r)))
            )),
            None => not_found(format_args!(
                "no task {id} on this shard: it completed (completed tasks are not kept), or it never was here"
            )),
        },
    }
}

/// The unfinished task of `queue` holding `idempotency_key` on this shard,
/// NULL if none: what an enqueue with the key would return. The driver asks
/// a key's former home with it while that shard drains (docs/residence.md,
/// "Keys have one home").
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn find_task(queue: Option<&str>, idempotency_key: Option<&str>) -> Option<pgrx::Uuid> {
    let queue = queues::check_name(queue);
    let key = required(idempotency_key, "idempotency_key");
    if key.is_empty() || key.len() > 256 {
        bad_argument(
            "idempotency_key",
            format!("must be 1 to 256 bytes, got {}", key.len()),
        );
    }
    enqueue::by_idempotency_key(queue, key)
}

/// A queue's tasks in `state` (NULL: every state, running, ready,
/// scheduled, waiting, then paused), each in its index's order, at most
/// `max_rows` (1..1000) after `after` (the `anchor` of the last row of the
/// page before).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_tasks(
    queue: Option<&str>,
    state: default!(Option<&str>, "NULL"),
    after: default!(Option<Jsonb>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(task_id, pgrx::Uuid),
        name!(kind, String),
        name!(task_state, String),
        name!(priority, i32),
        name!(attempts, i32),
        name!(max_attempts, i32),
        name!(run_at, TimestampWithTimeZone),
        name!(enqueued_at, TimestampWithTimeZone),
        name!(concurrency_key, Option<String>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
        name!(last_error, Option<String>),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(progress, Option<pgrx::JsonB>),
        name!(anchor, pgrx::JsonB),
    ),
> {
    let queue = queues::check_name(queue);
    let state = state.map(|s| {
        s.parse::<TaskState>().unwrap_or_else(|_| {
            bad_argument(
                "state",
                format!(
                    "must be scheduled, waiting, ready, running or paused, got {}",
                    excerpt(format_args!("{s:?}"))
                ),
            )
        })
    });
    let limit = page_rows(max_rows, MAX_PAGE);
    let after = after.map(|a| {
        let anchor = TaskAnchor::parse(&a.parse("after")).unwrap_or_else(|e| bad_argument("after", e));
        if state.is_some_and(|s| s != anchor.state()) {
            bad_argument(
                "after",
                format!(
                    "is an anchor of {} tasks, not of the state listed",
                    anchor.state()
                ),
            );
        }
        anchor
    });
    TableIterator::new(listing::tasks(queue, state, after.as_ref(), limit))
}

/// Dead letters of `queue` (NULL: every queue), newest first, at most
/// `max_rows` (1..1000) after `after` (the `anchor` of the last row of the
/// page before).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_dead_letters(
    queue: default!(Option<&str>, "NULL"),
    after: default!(Option<Jsonb>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(task_id, pgrx::Uuid),
        name!(queue_name, String),
        name!(kind, String),
        name!(priority, i32),
        name!(attempts, i32),
        name!(max_attempts, i32),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(concurrency_key, Option<String>),
        name!(last_error, Option<String>),
        name!(enqueued_at, TimestampWithTimeZone),
        name!(dead_at, TimestampWithTimeZone),
        name!(anchor, pgrx::JsonB),
    ),
> {
    let queue = queue.map(|q| queues::check_name(Some(q)));
    let limit = page_rows(max_rows, MAX_PAGE);
    let after =
        after.map(|a| DeadAnchor::parse(&a.parse("after")).unwrap_or_else(|e| bad_argument("after", e)));
    TableIterator::new(listing::dead_letters(queue, after, limit))
}

/// Every queue of this shard, by name: its configuration, its tasks by
/// state, its dead letters, and the age of its oldest ready task. Each
/// count walks an index: the cost follows the unfinished tasks.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_queues() -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(aging_secs, Option<i32>),
        name!(fairness, bool),
        name!(notify, bool),
        name!(created_at, TimestampWithTimeZone),
        name!(ready, i64),
        name!(scheduled, i64),
        name!(running, i64),
        name!(waiting, i64),
        name!(paused, i64),
        name!(dead, i64),
        name!(oldest_ready_age, Option<Interval>),
    ),
> {
    TableIterator::new(listing::queues().into_iter().map(|q| {
        (
            q.name,
            q.aging_secs,
            q.fairness,
            q.notify,
            q.created_at,
            q.ready,
            q.scheduled,
            q.running,
            q.waiting,
            q.paused,
            q.dead,
            q.oldest_ready_age,
        )
    }))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::{Split, row};
    use crate::testing::{claim, enqueue, init, one, rows};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Clone, Debug, PartialEq)]
        struct Listed {
            task_id: String,
            task_state: String,
        }
    }

    row! {
        /// Where a listing's next page starts.
        struct Anchor {
            anchor: pgrx::JsonB,
        }
    }

    /// Every page of `list_tasks('lq', state)` of `max_rows` rows, to the
    /// end, in the order listed.
    fn walk(state: Option<&str>, max_rows: i32) -> Vec<Listed> {
        let mut out = Vec::new();
        let mut after: Option<pgrx::JsonB> = None;
        loop {
            let page: Vec<Split<Listed, Anchor>> = rows(
                "SELECT task_id::text, task_state, anchor FROM sheaf.list_tasks('lq', $1, $2, $3)",
                &[state.into(), after.into(), max_rows.into()],
            );
            let n = page.len();
            after = page.last().map(|p| pgrx::JsonB(p.tail.anchor.0.clone()));
            out.extend(page.into_iter().map(|p| p.head));
            if n < max_rows as usize {
                return out;
            }
        }
    }

    #[pg_test]
    fn pages_list_every_task_once_state_by_state() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('lq-key', 1)").unwrap();
        let mut ready = Vec::new();
        for p in [0, 5, 0, -2] {
            ready.push(enqueue("lq", json!({}), json!({"priority": p})));
        }
        let later = enqueue("lq", json!({}), json!({"run_at": "2090-01-01T00:00:00Z"}));
        let first = enqueue("lq", json!({}), json!({"concurrency_key": "lq-key"}));
        let waiting: Vec<_> = (0..3)
            .map(|p| {
                enqueue(
                    "lq",
                    json!({}),
                    json!({"concurrency_key": "lq-key", "priority": p}),
                )
            })
            .collect();
        enqueue("other", json!({}), json!({"concurrency_key": "lq-key"}));
        Spi::run("SELECT * FROM sheaf.claim('lq', 'w', 1)").unwrap();
        let all = walk(None, 2);
        let states: Vec<&str> = all.iter().map(|t| t.task_state.as_str()).collect();
        assert_eq!(
            states,
            [
                "running",
                "ready",
                "ready",
                "ready",
                "ready",
                "scheduled",
                "waiting",
                "waiting",
                "waiting"
            ],
            "state by state, every task once: {all:?}"
        );
        let ids: std::collections::HashSet<_> = all.iter().map(|t| t.task_id.clone()).collect();
        assert_eq!(ids.len(), 9);
        assert!(ids.contains(&later.to_string()) && ids.contains(&first.to_string()));
        let waiting_order: Vec<String> = all[6..].iter().map(|t| t.task_id.clone()).collect();
        let expect: Vec<String> = waiting.iter().rev().map(|u| u.to_string()).collect();
        assert_eq!(waiting_order, expect, "the waiting line: priority descending");
        for size in [1, 3, 1000] {
            assert_eq!(walk(None, size), all, "pages of {size}");
        }
        assert_eq!(walk(Some("waiting"), 1), all[6..].to_vec());
        assert_eq!(walk(Some("paused"), 5), Vec::new());
    }

    #[pg_test(error = "invalid after: is an anchor of ready tasks, not of the state listed")]
    fn an_anchor_of_another_state_is_refused() {
        init();
        Spi::run(
            r#"SELECT * FROM sheaf.list_tasks('lq', 'waiting', '{"state": "ready", "k1": 0, "k2": 0, "seq": 1}')"#,
        )
        .unwrap();
    }

    #[pg_test]
    fn dead_letters_list_newest_first_and_a_task_reads_back() {
        init();
        let mut dead = Vec::new();
        for i in 0..3 {
            let id = enqueue("lq", json!({"i": i}), json!({"max_attempts": 1}));
            Spi::run(
                "SELECT f.* FROM sheaf.claim('lq', 'w', 1) c, LATERAL sheaf.fail(c.task_id, c.token, 'boom', NULL) f",
            )
            .unwrap();
            dead.push(id.to_string());
        }
        Spi::run("UPDATE sheaf.dead_letters SET dead_at = now() - make_interval(secs => (payload->>'i')::int * 10)")
            .unwrap();
        row! {
            struct Dead {
                task_id: String,
                anchor: pgrx::JsonB,
            }
        }
        let page = |after: Option<pgrx::JsonB>| -> Vec<Dead> {
            rows(
                "SELECT task_id::text, anchor FROM sheaf.list_dead_letters('lq', $1, 2)",
                &[after.into()],
            )
        };
        let first = page(None);
        let second = page(Some(pgrx::JsonB(first[1].anchor.0.clone())));
        let listed: Vec<&String> = first.iter().chain(second.iter()).map(|d| &d.task_id).collect();
        assert_eq!(listed, [&dead[0], &dead[1], &dead[2]], "newest first");
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sheaf.list_dead_letters()").unwrap(),
            Some(3)
        );
        row! {
            struct Task {
                state: String,
                payload: pgrx::JsonB,
                last_error: String,
            }
        }
        let task: Task = one(
            "SELECT state, payload, last_error FROM sheaf.get_task($1::uuid)",
            &[dead[2].as_str().into()],
        );
        assert_eq!(
            (task.state.as_str(), task.payload.0, task.last_error.as_str()),
            ("dead", json!({"i": 2}), "boom")
        );
        row! {
            struct Counts {
                ready: i64,
                dead: i64,
            }
        }
        let counts: Counts = one(
            "SELECT ready, dead FROM sheaf.list_queues() WHERE queue = 'lq'",
            &[],
        );
        assert_eq!((counts.ready, counts.dead), (0, 3));
    }

    #[pg_test(
        error = "no task 00000000-0000-0000-0000-000000000001 on this shard: it completed (completed tasks are not kept), or it never was here"
    )]
    fn an_unknown_task_is_not_found() {
        init();
        Spi::run("SELECT * FROM sheaf.get_task('00000000-0000-0000-0000-000000000001')").unwrap();
    }

    #[pg_test]
    fn a_running_task_says_when_its_attempt_was_claimed() {
        init();
        let id = enqueue("sq", json!({}), json!({}));
        // NULL before its claim; the claim's time while it runs.
        let started = || {
            Spi::get_one_with_args::<bool>(
                "SELECT started_at = (SELECT claimed_at FROM sheaf.tasks WHERE id = $1) FROM sheaf.get_task($1)",
                &[id.into()],
            )
            .unwrap()
        };
        assert_eq!(started(), None, "a ready task has not started");
        assert_eq!(claim("sq", 1).len(), 1);
        assert_eq!(
            started(),
            Some(true),
            "a running task started when it was claimed"
        );
    }
}
