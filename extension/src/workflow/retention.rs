//! Retention (`sheaf.set_retention`): what `sheaf.maintain` deletes once it
//! has been over long enough, in bounded batches. Ended executions go with
//! everything that hangs off them (history, signal ids, usage records,
//! children links, delivered outbox rows, records of their moves, dead
//! letters, whose quota counts follow), `MIGRATED` seals by their own
//! setting, dead letters by theirs. Never an active execution, a staged
//! copy, a run a move or the relay still works on, a child whose end its
//! parent does not have yet, or a parent whose child here has not ended.

use pgrx::prelude::*;
use serde_json::Value;
use sheaf_core::retention::{Keep, Retention};

use crate::base::catalog::{self, Feature};
use crate::base::errors::unknown_execution;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::dead_letters;
use crate::queue::hooks::ExecutionHooks;
use crate::workflow::{executions, quota};

/// Whether this catalog keeps a retention policy (not a 0.1.0 catalog).
pub fn enabled() -> bool {
    catalog::has(Feature::Retention)
}

const LOAD: Stmt = Stmt::read("SELECT policy FROM retention", &[]);
const STORE: Stmt = Stmt::write(
    "INSERT INTO retention (policy) VALUES ($1) \
     ON CONFLICT (one) DO UPDATE SET policy = excluded.policy, updated_at = now()",
    &[PgBuiltInOids::JSONBOID],
);

/// This shard's policy (the default, keep everything, until one is set).
pub fn policy() -> Retention {
    if !enabled() {
        return Retention::default();
    }
    let stored: Option<pgrx::JsonB> = LOAD.value(&[], "reading the retention policy");
    stored.map_or_else(Retention::default, |p| Retention::stored(&p.0))
}

/// Stores `policy`.
pub fn store(policy: &Retention) {
    STORE.exec(&[Jsonb::from_value(policy.to_json()).into()]);
}

/// Ended runs a batch may delete: past `$1` seconds, none of what keeps
/// them (an open move, the relay's rows, an outbox row not yet done, a
/// child whose parent does not have its end yet, a parent whose child here
/// has not reported its end). Where a parent lives decides, not the shard
/// its id names: a child's end is marked (`result_pulled_at`) when its
/// parent here gets it in the child's terminal transaction, when the relay
/// pulled it to a parent elsewhere, or when the child moves away from an
/// ended parent. `[every workflow but those in $2, only workflow $2]`.
macro_rules! ended {
    ($which:literal) => {
        concat!(
            "SELECT e.id FROM executions e \
             WHERE e.state IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'CONTINUED_AS_NEW') \
               AND e.closed_at < now() - make_interval(secs => $1) AND ",
            $which,
            " AND (e.parent_id IS NULL OR e.result_pulled_at IS NOT NULL) \
               AND NOT EXISTS (SELECT 1 FROM executions k WHERE k.parent_id = e.id \
                               AND k.state <> 'MIGRATED' AND k.result_pulled_at IS NULL) \
               AND NOT EXISTS (SELECT 1 FROM cross_shard_children c WHERE c.parent_id = e.id) \
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.sender_id = e.id AND o.state <> 'DONE') \
               AND NOT EXISTS (SELECT 1 FROM migrations m WHERE m.execution_id = e.id \
                               AND m.phase NOT IN ('DONE', 'ABORTED')) \
             ORDER BY e.closed_at LIMIT $3 FOR UPDATE OF e SKIP LOCKED"
        )
    };
}
const ENDED_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::FLOAT8OID,
    PgBuiltInOids::TEXTARRAYOID,
    PgBuiltInOids::INT8OID,
];
const ENDED_OTHERS: Stmt = Stmt::write(ended!("e.workflow_name <> ALL ($2)"), ENDED_ARGS);
const ENDED_OF: Stmt = Stmt::write(ended!("e.workflow_name = ($2)[1]"), ENDED_ARGS);
// A seal is the only forward for ids of this shard: deleted only once the
// relay found its run ended where it lives (`seal_released_at`).
const SEALS: Stmt = Stmt::write(
    "SELECT e.id FROM executions e \
     WHERE e.state = 'MIGRATED' AND e.closed_at < now() - make_interval(secs => $1) \
       AND e.seal_released_at IS NOT NULL \
       AND NOT EXISTS (SELECT 1 FROM migrations m WHERE m.execution_id = e.id \
                       AND m.phase NOT IN ('DONE', 'ABORTED')) \
     ORDER BY e.closed_at LIMIT $2 FOR UPDATE OF e SKIP LOCKED",
    &[PgBuiltInOids::FLOAT8OID, PgBuiltInOids::INT8OID],
);

// What hangs off the runs `$1`, then the runs. Dead letters first, with the
// quota keys their count goes back to (the runs are locked: quota rows come
// after execution rows, `base::locks`).
const DEAD_LETTERS: Stmt = Stmt::write(
    "WITH gone AS (DELETE FROM dead_letters WHERE execution_id = ANY($1) RETURNING execution_id) \
     SELECT e.quota_key, count(*) FROM gone JOIN executions e ON e.id = gone.execution_id \
     WHERE e.quota_key IS NOT NULL GROUP BY e.quota_key ORDER BY e.quota_key",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const EVENTS: Stmt = Stmt::write(
    "WITH gone AS (DELETE FROM events WHERE execution_id = ANY($1) RETURNING 1) SELECT count(*) FROM gone",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const REST: [&str; 6] = [
    "DELETE FROM signals_seen WHERE execution_id = ANY($1)",
    "DELETE FROM usage_records WHERE execution_id = ANY($1)",
    "DELETE FROM children WHERE parent_id = ANY($1)",
    "DELETE FROM outbox WHERE sender_id = ANY($1)",
    "DELETE FROM migrations WHERE execution_id = ANY($1)",
    "DELETE FROM executions WHERE id = ANY($1)",
];
const REST_STMTS: [Stmt; 6] = [
    Stmt::write(REST[0], &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(REST[1], &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(REST[2], &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(REST[3], &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(REST[4], &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(REST[5], &[PgBuiltInOids::UUIDARRAYOID]),
];

/// What one pass deleted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pruned {
    pub executions: i64,
    pub events: i64,
    pub seals: i64,
    pub dead_letters: i64,
}

impl Pruned {
    pub fn to_json(self) -> Value {
        serde_json::json!({
            "executions": self.executions,
            "events": self.events,
            "seals": self.seals,
            "dead_letters": self.dead_letters,
        })
    }
}

/// Deletes runs `ids` (locked) with everything hanging off them; how many
/// events and dead letters went with them.
fn delete(ids: Vec<pgrx::Uuid>) -> (i64, i64) {
    row! {
        /// A quota key, and how many of its dead letters went.
        struct PerKey {
            key: String,
            n: i64,
        }
    }
    let (per_key, events): (Vec<PerKey>, i64) = {
        let per_key = DEAD_LETTERS.all(&[ids.clone().into()], "deleting the dead letters of ended runs");
        let events = EVENTS.one_value(&[ids.clone().into()], "deleting history");
        (per_key, events)
    };
    let mut dead = 0;
    for PerKey { key, n } in per_key {
        quota::add(&key, 0, 0, -n);
        dead += n;
    }
    for stmt in &REST_STMTS {
        stmt.exec(&[ids.clone().into()]);
    }
    (events, dead)
}

fn ids(stmt: &Stmt, args: &[pgrx::datum::DatumWithOid<'_>], doing: &str) -> Vec<pgrx::Uuid> {
    stmt.values(args, doing)
}

/// One bounded pass of `policy`: at most `max` runs (ended ones, then
/// seals) and `max` dead letters.
pub fn prune(policy: &Retention, max: i64, hooks: &dyn ExecutionHooks) -> Pruned {
    let mut out = Pruned::default();
    let mut left = max;
    // Each workflow with its own setting, then every other one.
    let own: Vec<String> = policy.workflows.keys().cloned().collect();
    let mut passes: Vec<(&Stmt, Vec<String>, Keep)> = policy
        .workflows
        .iter()
        .map(|(name, keep)| (&ENDED_OF, vec![name.clone()], *keep))
        .collect();
    passes.push((&ENDED_OTHERS, own, policy.executions));
    for (stmt, names, keep) in passes {
        let Some(secs) = keep.secs() else { continue };
        if left <= 0 {
            break;
        }
        let found = ids(
            stmt,
            &[secs.into(), names.into(), left.into()],
            "choosing ended runs to delete",
        );
        left -= found.len() as i64;
        out.executions += found.len() as i64;
        if !found.is_empty() {
            let (events, dead) = delete(found);
            out.events += events;
            out.dead_letters += dead;
        }
    }
    if let (Some(secs), true) = (policy.seals.secs(), left > 0) {
        let found = ids(&SEALS, &[secs.into(), left.into()], "choosing seals to delete");
        out.seals = found.len() as i64;
        if !found.is_empty() {
            let (events, dead) = delete(found);
            out.events += events;
            out.dead_letters += dead;
        }
    }
    if let Some(secs) = policy.dead_letters.secs() {
        out.dead_letters += dead_letters::expire(secs, max, hooks);
    }
    out
}

// Seals past their window whose run the relay has yet to find ended.
const SEALS_DUE: Stmt = Stmt::read(
    "SELECT id, migrated_to_shard FROM executions \
     WHERE state = 'MIGRATED' AND seal_released_at IS NULL AND closed_at < now() - make_interval(secs => $1) \
     ORDER BY closed_at LIMIT $2",
    &[PgBuiltInOids::FLOAT8OID, PgBuiltInOids::INT8OID],
);
const RELEASE: Stmt = Stmt::write(
    "UPDATE executions SET seal_released_at = coalesce(seal_released_at, now()) \
     WHERE id = $1 AND state = 'MIGRATED' RETURNING 1",
    &[PgBuiltInOids::UUIDOID],
);

row! {
    /// A seal whose run may have ended, and where it forwards.
    pub struct SealDue {
        pub execution_id: pgrx::Uuid,
        pub moved_to: Option<i32>,
    }
}

/// Up to `max` seals past the `seals` window whose run has not been found
/// ended yet, oldest move first. None while seals are kept forever.
pub fn seals_due(max: i64) -> Vec<SealDue> {
    let Some(secs) = policy().seals.secs() else {
        return Vec::new();
    };
    SEALS_DUE.all(&[secs.into(), max.into()], "choosing seals to check")
}

/// The relay found seal `id`'s run ended where it lived (or gone from
/// there): retention may delete the seal once its window has passed.
/// Whether `id` is a seal here.
pub fn seal_run_ended(id: pgrx::Uuid) -> bool {
    RELEASE.count(&[id.into()]) > 0
}

const PULLED: Stmt = Stmt::write(
    "UPDATE executions SET result_pulled_at = now() \
     WHERE id = $1 AND closed_at IS NOT NULL AND result_pulled_at IS NULL RETURNING 1",
    &[PgBuiltInOids::UUIDOID],
);

/// The relay pulled ended child `id`'s end into its parent's history on
/// another shard: retention may delete it now. Whether this marked it (not
/// an active run, or one marked already). A run that moved is forwarded
/// (55000 naming where it lives), so its live copy is the one marked.
pub fn pulled(id: pgrx::Uuid) -> bool {
    match executions::state_of(id) {
        None => unknown_execution(id),
        Some(state) => executions::forward(id, state),
    }
    PULLED.count(&[id.into()]) > 0
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{count, init, one, start};
    use pgrx::prelude::*;
    use serde_json::json;

    /// Starts `name`/`id` and completes it `days_ago` days ago.
    fn ended(name: &str, id: &str, days_ago: i32) -> pgrx::Uuid {
        let execution = start(name, id, json!({"tenant": "t1"})).id;
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[execution.into()]).unwrap();
        Spi::run_with_args(
            "UPDATE sheaf.executions SET closed_at = now() - make_interval(days => $2) WHERE id = $1",
            &[execution.into(), days_ago.into()],
        )
        .unwrap();
        execution
    }

    fn maintain() -> serde_json::Value {
        Spi::get_one::<pgrx::JsonB>("SELECT sheaf.maintain()")
            .unwrap()
            .unwrap()
            .0["retention"]
            .clone()
    }

    fn exists(id: pgrx::Uuid) -> bool {
        Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM sheaf.executions WHERE id = $1)",
            &[id.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn ended_runs_past_their_window_go_with_their_history_and_nothing_else_does() {
        init();
        Spi::run(r#"SELECT sheaf.declare_workflow('rw', '{"quota": {"key": "input.tenant", "max_dead_letters": 9}}')"#)
            .unwrap();
        let old = ended("rw", "old", 40);
        let recent = ended("rw", "recent", 10);
        let kept_longer = ended("rw-keep", "old", 40);
        let active = start("rw", "active", json!({"tenant": "t1"})).id;
        Spi::run_with_args(
            "UPDATE sheaf.executions SET created_at = now() - interval '90 days' WHERE id = $1",
            &[active.into()],
        )
        .unwrap();
        // A dead letter of the old run counts against its tenant's quota.
        Spi::run_with_args(
            "INSERT INTO sheaf.dead_letters (id, queue, kind, payload, priority, attempts, max_attempts, \
             execution_id, fairness_weight, enqueued_at) VALUES (gen_random_uuid(), 'q', 'activity', '{}', 0, 1, 1, $1, 1, now())",
            &[old.into()],
        )
        .unwrap();
        Spi::run("SELECT * FROM sheaf.quota_recompute('t1')").unwrap();
        let policy = Spi::get_one::<pgrx::JsonB>(
            r#"SELECT sheaf.set_retention('{"executions": "30days", "workflows": {"rw-keep": {"executions": "60days"}}}')"#,
        )
        .unwrap()
        .unwrap()
        .0;
        assert_eq!(
            policy["workflows"]["rw-keep"]["executions"],
            json!("60days"),
            "{policy}"
        );
        let events_before = count("SELECT count(*) FROM sheaf.events");
        let pruned = maintain();
        assert_eq!(pruned["executions"], json!(1), "{pruned}");
        assert_eq!(pruned["dead_letters"], json!(1), "{pruned}");
        assert!(!exists(old));
        assert!(exists(recent) && exists(kept_longer) && exists(active));
        let events_after = count("SELECT count(*) FROM sheaf.events");
        assert_eq!(events_before - events_after, pruned["events"].as_i64().unwrap());
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.events WHERE execution_id NOT IN (SELECT id FROM sheaf.executions)"
            ),
            0
        );
        row! {
            struct DeadLetters {
                counted: i64,
                recounted: i64,
            }
        }
        let dead: DeadLetters = one(
            "SELECT (SELECT dead_letters FROM sheaf.quota_usage('t1')), (SELECT dead_letters FROM sheaf.quota_recompute('t1'))",
            &[],
        );
        assert_eq!(
            (dead.counted, dead.recounted),
            (0, 0),
            "the counter equals a recount"
        );
        assert_eq!(
            maintain()["executions"],
            json!(0),
            "nothing more is past its window"
        );
    }

    #[pg_test]
    fn a_child_waits_for_its_parent_on_another_shard_to_pull_its_end() {
        init();
        let child = ended("rc", "child", 40);
        // Its parent lives on shard 2 (an id minted there).
        Spi::run_with_args(
            "UPDATE sheaf.executions SET parent_id = ('0002' || substr(gen_random_uuid()::text, 5))::uuid WHERE id = $1",
            &[child.into()],
        )
        .unwrap();
        Spi::run(r#"SELECT sheaf.set_retention('{"executions": "30days"}')"#).unwrap();
        assert_eq!(maintain()["executions"], json!(0));
        assert!(exists(child), "kept until pulled");
        assert_eq!(
            Spi::get_one_with_args::<bool>("SELECT sheaf.relay_pulled($1)", &[child.into()]).unwrap(),
            Some(true)
        );
        assert_eq!(maintain()["executions"], json!(1));
        assert!(!exists(child));
    }

    #[pg_test]
    fn a_parent_here_and_its_local_child_wait_for_each_other_by_residence() {
        init();
        let parent = start("rp", "parent", json!({})).id;
        let child = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT child_id FROM sheaf.start_child($1, 'rk', 'kid', '{}', '{\"parent_close\": \"abandon\"}')",
            &[parent.into()],
        )
        .unwrap()
        .unwrap();
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[parent.into()]).unwrap();
        let age =
            "UPDATE sheaf.executions SET closed_at = now() - interval '40 days' WHERE closed_at IS NOT NULL";
        Spi::run(age).unwrap();
        Spi::run(r#"SELECT sheaf.set_retention('{"executions": "30days"}')"#).unwrap();
        assert_eq!(maintain()["executions"], json!(0));
        assert!(exists(parent), "kept while its child here has not ended");
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[child.into()]).unwrap();
        let marked = Spi::get_one_with_args::<bool>(
            "SELECT result_pulled_at IS NOT NULL FROM sheaf.executions WHERE id = $1",
            &[child.into()],
        )
        .unwrap();
        assert_eq!(
            marked,
            Some(true),
            "its parent here had its end in its terminal transaction"
        );
        Spi::run(age).unwrap();
        assert_eq!(maintain()["executions"], json!(2));
        assert!(!exists(parent) && !exists(child));
    }

    #[pg_test]
    fn seals_and_dead_letters_keep_their_own_windows() {
        init();
        let seal = ended("rs", "seal", 40);
        Spi::run_with_args(
            "UPDATE sheaf.executions SET state = 'MIGRATED', migrated_to_shard = 2 WHERE id = $1",
            &[seal.into()],
        )
        .unwrap();
        Spi::run(
            "INSERT INTO sheaf.dead_letters (id, queue, kind, payload, priority, attempts, max_attempts, \
             fairness_weight, enqueued_at, dead_at) VALUES \
             (gen_random_uuid(), 'q', 'activity', '{}', 0, 1, 1, 1, now(), now() - interval '3 days'), \
             (gen_random_uuid(), 'q', 'activity', '{}', 0, 1, 1, 1, now(), now() - interval '1 hour')",
        )
        .unwrap();
        Spi::run(r#"SELECT sheaf.set_retention('{"executions": "1day", "dead_letters": "2days"}')"#).unwrap();
        let pruned = maintain();
        assert_eq!(
            (pruned["seals"].clone(), pruned["dead_letters"].clone()),
            (json!(0), json!(1))
        );
        assert!(exists(seal), "seals keep their own setting (forever here)");
        Spi::run(r#"SELECT sheaf.set_retention('{"seals": "30days"}')"#).unwrap();
        // Its run may still live where it forwards: kept until the relay
        // finds it ended there.
        assert_eq!(maintain()["seals"], json!(0));
        assert!(exists(seal), "a seal whose run may live is kept");
        let due = Spi::get_one::<pgrx::Uuid>("SELECT execution_id FROM sheaf.seals_due()").unwrap();
        assert_eq!(due, Some(seal));
        let marked =
            Spi::get_one_with_args::<bool>("SELECT sheaf.seal_run_ended($1)", &[seal.into()]).unwrap();
        assert_eq!(marked, Some(true));
        assert_eq!(count("SELECT count(*) FROM sheaf.seals_due()"), 0);
        assert_eq!(maintain()["seals"], json!(1));
        assert!(!exists(seal));
        let policy = Spi::get_one::<pgrx::JsonB>("SELECT sheaf.retention()")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(
            policy["executions"],
            json!("1day"),
            "the fields not named kept: {policy}"
        );
    }

    #[pg_test(
        error = "invalid opts.executions: must be from 1 minute to 100 years (or \"forever\"), got 30 seconds"
    )]
    fn a_short_window_is_refused() {
        init();
        Spi::run(r#"SELECT sheaf.set_retention('{"executions": "30s"}')"#).unwrap();
    }
}
