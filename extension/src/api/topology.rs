//! The fleet's topology on this shard: published by an operator (its
//! projection, and the digest computed from it), read back for status, and
//! asked where work belongs (`place_start`, `place_task`, `place_mutex`,
//! `locate_id`: `sheaf_core::placement` over the published projection).

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use sheaf_core::options::EnqueueOptions;
use sheaf_core::placement::{PlaceError, Projection, placement_from_json};

use crate::api::executions::{check_workflow_id, start_options};
use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::base::{shard, topology};
use crate::queue::queues;
use crate::workflow::{executions, policy};

/// 0.2.0's `publish_topology(text, boolean)`, a digest alone: kept for a
/// 0.2.0 catalog served by this library until `ALTER EXTENSION sheaf
/// UPDATE` (no SQL of its own: a fresh install has the projection's).
#[pg_extern(sql = false, volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn publish_topology(
    topology_digest: Option<&str>,
    keep_previous: default!(Option<bool>, true),
) -> TableIterator<'static, (name!(digest, String), name!(previous, Option<String>))> {
    let digest = required(topology_digest, "topology_digest");
    if !sheaf_core::digest::is_digest(digest) {
        bad_argument(
            "topology_digest",
            format!(
                "must be sha256: and 64 lowercase hex digits, got {} bytes",
                digest.len()
            ),
        );
    }
    let keep = required(keep_previous, "keep_previous");
    let topology::Accepted {
        digest: now,
        previous,
    } = topology::publish(digest, keep);
    audit::record(
        "publish_topology",
        &now,
        "ok",
        serde_json::json!({"previous": previous}),
    );
    TableIterator::once((now, previous))
}

/// Publishes the fleet's topology on this shard, as its projection (ids,
/// readable, writable, reserved, default, residency map, forwards: what
/// `sheaf topology show` prints; never connection strings). The digest is
/// computed here from the projection's canonical form; the projection is
/// kept beside it, and placement answers from it. From now on placed work
/// from a client that declares another digest is refused (55000). The
/// digest it replaces stays accepted, with its projection, as `previous`
/// while a change rolls out, unless `keep_previous` is false. A projection
/// that does not list this shard is refused.
#[pg_extern(name = "publish_topology", volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn publish_topology_projection(
    projection: Option<Jsonb>,
    keep_previous: default!(Option<bool>, true),
) -> TableIterator<'static, (name!(digest, String), name!(previous, Option<String>))> {
    let value = required(projection, "projection").parse("projection");
    let projection = Projection::from_json(&value).unwrap_or_else(|e| bad_argument("projection", e));
    let here = shard::current();
    let listed = u16::try_from(here).is_ok_and(|id| projection.contains(id));
    if !listed {
        bad_argument(
            "projection",
            format!("does not list this shard ({here}): publish a shard's own fleet on it"),
        );
    }
    let keep = required(keep_previous, "keep_previous");
    let topology::Accepted {
        digest: now,
        previous,
    } = topology::publish_projection(&projection, keep);
    audit::record(
        "publish_topology",
        &now,
        "ok",
        serde_json::json!({"previous": previous}),
    );
    TableIterator::once((now, previous))
}

/// The published topology's projection, or 55000 naming what to do.
fn current() -> Projection {
    match topology::fleet() {
        Some(fleet) => fleet.current,
        None => not_ready(
            "no topology projection is published on this shard: publish one (sheaf topology publish) to ask it for placement",
        ),
    }
}

/// A placement refused by the topology: 22023 on `arg`, naming why but
/// no shard or residency key.
fn refused(arg: &str, e: PlaceError) -> ! {
    bad_argument(arg, e)
}

/// The shard that owns a start of workflow `name` with `workflow_id` under
/// the published topology: `opts` as `start_workflow` takes them, with
/// `placement` (`shard`, `residency_key`, `routing_key`, `tenant`) and
/// `debounce` (its `key` places it). Any shard answers alike.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn place_start(name: Option<&str>, workflow_id: Option<&str>, opts: default!(Option<Jsonb>, "'{}'")) -> i32 {
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let opts = required(opts, "opts").parse("opts");
    let o = start_options(&opts);
    let debounce_key = o.debounce.as_ref().map(|d| d.key.as_str());
    let owner = current()
        .place_start(name, workflow_id, &o.placement, o.tenant.as_deref(), debounce_key)
        .unwrap_or_else(|e| refused("opts.placement", e));
    i32::from(owner)
}

/// The shard that owns a task of `queue` with no execution under the
/// published topology: `opts` as `enqueue` takes them, with `placement`
/// (`shard`, `residency_key`, `routing_key`). By its `idempotency_key`,
/// else its `rate_key` under its `rate_limit`, else its placement; NULL
/// when nothing places it (any writable, unreserved shard takes it).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn place_task(queue: Option<&str>, opts: default!(Option<Jsonb>, "'{}'")) -> Option<i32> {
    let queue = queues::check_name(queue);
    let opts = required(opts, "opts").parse("opts");
    let o = EnqueueOptions::parse(&opts).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    if o.execution_id.is_some() {
        bad_argument(
            "opts.execution_id",
            "a task of an execution goes where its execution lives: ask sheaf.locate_id",
        );
    }
    current()
        .place_task(
            queue,
            o.idempotency_key.as_deref(),
            o.rate_limit.as_deref(),
            o.rate_key.as_deref(),
            &o.placement,
        )
        .unwrap_or_else(|e| refused("opts.placement", e))
        .map(i32::from)
}

/// The shard a mutex key lives on under the published topology (a key
/// placed by hashing; a key pinned to a shard or to a run lives there).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn place_mutex(mutex_key: Option<&str>) -> i32 {
    let key = args::key(mutex_key, "mutex_key");
    i32::from(current().place_mutex(key))
}

/// Where id `id` (an execution's or a task's) lives, as far as this shard
/// knows: its origin shard (the first two bytes; the default shard for an
/// unencoded id), through the topology's forwards of retired shards, then,
/// when that is this shard and the run moved away, its seal's forward. An
/// answer naming another shard may be followed further there.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn locate_id(id: Option<pgrx::Uuid>) -> i32 {
    let id = required(id, "id");
    let p = current();
    let first = p.route_origin(sheaf_core::id::shard_of(id.as_bytes()));
    if i32::from(first) != shard::current() {
        return i32::from(first);
    }
    match executions::moved_to(id) {
        Some(to) => u16::try_from(to).map_or(to, |to| i32::from(p.serving(to))),
        None => i32::from(first),
    }
}

/// The projections this shard accepts: the published one (`accepted_as`
/// `current`), then the one it replaced while a change rolls out
/// (`previous`), each as published (canonical form) with its digest; no
/// row when none was published. Any client can route by it
/// (docs/reference/placement.md).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn topology_projections() -> TableIterator<
    'static,
    (
        name!(digest, String),
        name!(accepted_as, String),
        name!(projection, pgrx::JsonB),
        name!(published_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(
        topology::projections()
            .into_iter()
            .map(|p| (p.digest, p.accepted_as, p.projection, p.published_at)),
    )
}

/// Live runs on this shard that the published topology places on another
/// shard (`owner_shard`; NULL when it refuses the run's placement, e.g. a
/// residency key no longer declared), by id, at most `max_rows` (1 to 10,000):
/// started here before the topology changed or was published, or sent by
/// hand. Runs that arrived by a move, children, schedule and debounced
/// runs, runs pinned to a shard, and runs started before 0.3.0 are not
/// listed. No row when no projection is published. Reads every live run an
/// application placed here (a scan, as `count(*)` is).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn misplaced_runs(
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(owner_shard, Option<i32>),
        name!(placement, pgrx::JsonB),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    let max = args::page_rows(max_rows, 10_000) as usize;
    let Some(fleet) = topology::fleet() else {
        return TableIterator::new(Vec::new());
    };
    let here = shard::current();
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let page = executions::placed_live(after, 1_000);
        let last = page.last().map(|r| r.id);
        for run in page {
            let owner = match placement_from_json(&run.placement.0) {
                Ok((pin, tenant)) => fleet
                    .current
                    .place(&run.workflow_name, &run.workflow_id, &pin, tenant.as_deref())
                    .ok(),
                // Written by this library's own start: unreadable only if
                // the row was edited by hand; listed, with no owner.
                Err(_) => None,
            };
            if owner.map(i32::from) != Some(here) {
                found.push((
                    run.id,
                    run.workflow_name,
                    run.workflow_id,
                    owner.map(i32::from),
                    run.placement,
                    run.created_at,
                ));
                if found.len() >= max {
                    return TableIterator::new(found);
                }
            }
        }
        match last {
            Some(id) => after = Some(id),
            None => return TableIterator::new(found),
        }
    }
}

/// The digest published on this shard, the previous one still accepted,
/// and when; no row if none was published.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn published_topology() -> TableIterator<
    'static,
    (
        name!(digest, String),
        name!(previous, Option<String>),
        name!(published_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(topology::published().map(|p| (p.digest, p.previous, p.at)))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::base::subxact::attempt;
    use crate::testing::init;
    use pgrx::prelude::*;
    use serde_json::{Value, json};

    fn publish(projection: &Value) {
        Spi::run_with_args(
            "SELECT sheaf.publish_topology($1, false)",
            &[pgrx::JsonB(projection.clone()).into()],
        )
        .unwrap();
    }

    /// What a placement call answers: `{"owner": ..}`, or `{"error": ..}`
    /// for a refusal (22023: the vectors' codes are not SQLSTATEs).
    fn ask(sql: &str, args: Vec<pgrx::datum::DatumWithOid<'static>>) -> Value {
        let args = std::cell::RefCell::new(Some(args));
        match attempt(|| Spi::get_one_with_args::<i32>(sql, &args.borrow_mut().take().unwrap())) {
            Ok(owner) => json!({ "owner": owner.unwrap() }),
            Err(failed) => {
                assert_eq!(failed.sqlstate, "22023", "{sql}: {}", failed.message);
                json!({ "error": true })
            }
        }
    }

    fn expected(v: &Value) -> Value {
        match v.get("error") {
            Some(_) => json!({ "error": true }),
            None => json!({ "owner": v["owner"] }),
        }
    }

    /// The shared vectors (core/testdata/placement_vectors.json), every
    /// one answered by this shard's placement functions as by the driver's
    /// router (driver/src/router.rs, `vectors`). Every vector topology
    /// lists shard 1, this one.
    #[pg_test]
    fn the_placement_functions_answer_every_vector() {
        init();
        let vectors: Value =
            serde_json::from_str(include_str!("../../../core/testdata/placement_vectors.json")).unwrap();
        for t in vectors["topologies"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            publish(&t["projection"]);
            let digest = Spi::get_one::<String>("SELECT digest FROM sheaf.published_topology()").unwrap();
            assert_eq!(digest.as_deref(), t["digest"].as_str());
            let of = |list: &str| {
                vectors[list]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|v| v["topology"] == name)
                    .cloned()
                    .collect::<Vec<Value>>()
            };
            for v in of("starts") {
                let mut opts = json!({ "placement": v["placement"] });
                if let Some(key) = v["debounce_key"].as_str() {
                    opts["debounce"] = json!({ "key": key, "window": "1s" });
                }
                let got = ask(
                    "SELECT sheaf.place_start($1, $2, $3)",
                    vec![
                        v["workflow_name"].as_str().unwrap().to_owned().into(),
                        v["workflow_id"].as_str().unwrap().to_owned().into(),
                        pgrx::JsonB(opts).into(),
                    ],
                );
                assert_eq!(got, expected(&v), "{v}");
            }
            for v in of("tasks") {
                let mut opts = json!({ "placement": v["placement"] });
                for k in ["idempotency_key", "rate_limit", "rate_key"] {
                    if !v[k].is_null() {
                        opts[k] = v[k].clone();
                    }
                }
                let sql = "SELECT coalesce(sheaf.place_task($1, $2), -1)";
                let got = ask(sql, vec!["emails".to_owned().into(), pgrx::JsonB(opts).into()]);
                let want = match expected(&v) {
                    w if w["owner"].is_null() && w.get("error").is_none() => json!({ "owner": -1 }),
                    w => w,
                };
                assert_eq!(got, want, "{v}");
            }
            for v in of("mutexes") {
                let key = v["mutex_key"].as_str().unwrap().to_owned();
                let got = ask("SELECT sheaf.place_mutex($1)", vec![key.into()]);
                assert_eq!(got, expected(&v), "{v}");
            }
            for v in of("ids") {
                let id = pgrx::Uuid::from_bytes(
                    *uuid::Uuid::parse_str(v["id"].as_str().unwrap())
                        .unwrap()
                        .as_bytes(),
                );
                let got = ask("SELECT sheaf.locate_id($1)", vec![id.into()]);
                assert_eq!(got, expected(&v), "{v}");
            }
        }
    }

    #[pg_test]
    fn an_id_follows_its_seal_and_the_forwards() {
        init();
        publish(&json!({"shards": [1, 2, 3], "forwards": {"7": 3}}));
        let id = crate::testing::values::<pgrx::Uuid>(
            r#"SELECT execution_id FROM sheaf.start_workflow('wf', 'moved', '{}', '{"placement": {"shard": 1}}')"#,
            &[],
        )[0];
        let locate = |id: pgrx::Uuid| {
            Spi::get_one_with_args::<i32>("SELECT sheaf.locate_id($1)", &[id.into()])
                .unwrap()
                .unwrap()
        };
        assert_eq!(locate(id), 1, "it lives here");
        Spi::run_with_args(
            "UPDATE sheaf.executions SET state = 'MIGRATED', migrated_to_shard = 2 WHERE id = $1",
            &[id.into()],
        )
        .unwrap();
        assert_eq!(locate(id), 2, "its seal's forward");
        let retired = sheaf_core::id::compose(7, 1_767_225_600_000, 42).unwrap();
        assert_eq!(
            locate(pgrx::Uuid::from_bytes(retired)),
            3,
            "a retired shard's forward"
        );
        let unencoded = pgrx::Uuid::from_bytes(*uuid::Uuid::new_v4().as_bytes());
        assert_eq!(locate(unencoded), 1, "the default shard");
    }

    #[pg_test]
    #[should_panic(expected = "no topology projection is published on this shard")]
    fn placement_needs_a_published_topology() {
        init();
        Spi::run("SELECT sheaf.place_mutex('k')").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "invalid opts.placement: unknown field")]
    fn a_bad_placement_is_named() {
        init();
        publish(&json!({"shards": [1]}));
        Spi::run(r#"SELECT sheaf.place_start('wf', 'x', '{"placement": {"region": "eu"}}')"#).unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "a task of an execution goes where its execution lives")]
    fn a_task_of_an_execution_is_located_by_id() {
        init();
        publish(&json!({"shards": [1]}));
        Spi::run(
            r#"SELECT sheaf.place_task('q', '{"execution_id": "00010000-0000-8000-8000-000000000000"}')"#,
        )
        .unwrap();
    }

    /// The first `n` keys `<prefix><number>` that placement call `sql`
    /// (the key its one text argument) answers `shard` for.
    fn keys_on(sql: &str, prefix: &str, shard: i32, n: usize) -> Vec<String> {
        (0..1000)
            .map(|i| format!("{prefix}{i}"))
            .filter(|k| Spi::get_one_with_args::<i32>(sql, &[k.clone().into()]).unwrap() == Some(shard))
            .take(n)
            .collect()
    }

    /// A workflow id of workflow `wf` whose start the published topology
    /// places on `shard`.
    fn owned_by(shard: i32) -> String {
        keys_on("SELECT sheaf.place_start('wf', $1)", "w", shard, 1).remove(0)
    }

    /// The SQLSTATE and message of `sql` with `args`, or `None` if it ran.
    fn refusal(sql: &str, args: Vec<pgrx::datum::DatumWithOid<'static>>) -> Option<(String, String)> {
        let args = std::cell::RefCell::new(Some(args));
        attempt(|| Spi::run_with_args(sql, &args.borrow_mut().take().unwrap()))
            .err()
            .map(|f| (f.sqlstate, f.message))
    }

    fn start(workflow_id: &str, opts: Value) -> Option<(String, String)> {
        refusal(
            "SELECT sheaf.start_workflow('wf', $1, '{}', $2)",
            vec![workflow_id.to_owned().into(), pgrx::JsonB(opts).into()],
        )
    }

    fn assert_misplaced(refused: Option<(String, String)>, owner: u16) {
        let (code, message) = refused.expect("refused");
        assert_eq!(code, "23514", "{message}");
        assert!(
            message.contains(&format!("belongs to shard {owner} ")),
            "{message}"
        );
    }

    /// With a topology published, a start its key places on another shard
    /// is refused naming the owner; the owner's, and a start placed here
    /// in so many words, are taken.
    #[pg_test]
    fn a_start_placed_elsewhere_is_refused_naming_its_owner() {
        init();
        publish(&json!({"shards": [1, 2]}));
        let (mine, theirs) = (owned_by(1), owned_by(2));
        assert_eq!(start(&mine, json!({})), None);
        assert_misplaced(start(&theirs, json!({})), 2);
        assert_misplaced(
            refusal(
                "SELECT sheaf.signal_with_start('wf', $1, '{}', 'go', '{}')",
                vec![theirs.clone().into()],
            ),
            2,
        );
        assert_eq!(
            start(&theirs, json!({"placement": {"shard": 1}})),
            None,
            "pinned here"
        );
        let (code, message) = start("x", json!({"placement": {"shard": 7}})).unwrap();
        assert_eq!(
            (code.as_str(), message.contains("opts.placement")),
            ("22023", true),
            "{message}"
        );
        // A routing key or tenant places it by that key instead.
        let sql = "SELECT sheaf.place_start('wf', 'any', \
                   jsonb_build_object('placement', jsonb_build_object('routing_key', $1::text)))";
        let key_here = keys_on(sql, "k", 1, 1).remove(0);
        assert_eq!(
            start(&theirs, json!({"placement": {"routing_key": key_here}})),
            None
        );
    }

    /// While a change rolls out (the previous projection kept), a start
    /// either projection places here is taken; once it is replaced, only
    /// the new one counts.
    #[pg_test]
    fn a_rollout_accepts_the_previous_projections_placement() {
        init();
        publish(&json!({"shards": [1, 2]}));
        let theirs = owned_by(2);
        publish(&json!({"shards": [1]}));
        Spi::run_with_args(
            "SELECT sheaf.publish_topology($1, true)",
            &[pgrx::JsonB(json!({"shards": [1, 2]})).into()],
        )
        .unwrap();
        assert_eq!(
            start(&theirs, json!({})),
            None,
            "the previous projection places it here"
        );
        publish(&json!({"shards": [1, 2]}));
        assert_misplaced(start(&theirs, json!({})), 2);
    }

    /// A keyed task (idempotency or rate key) or a placed one is checked
    /// like a start; a task with neither goes anywhere, and a task of an
    /// execution goes where its execution lives.
    #[pg_test]
    fn a_keyed_task_placed_elsewhere_is_refused() {
        init();
        publish(&json!({"shards": [1, 2]}));
        let key_on = |shard: i32| {
            let sql = "SELECT sheaf.place_task('q', jsonb_build_object('idempotency_key', $1::text))";
            keys_on(sql, "k", shard, 1).remove(0)
        };
        let enqueue = |opts: Value| {
            refusal(
                "SELECT sheaf.enqueue('q', '{}', $1)",
                vec![pgrx::JsonB(opts).into()],
            )
        };
        assert_eq!(enqueue(json!({"idempotency_key": key_on(1)})), None);
        assert_misplaced(enqueue(json!({"idempotency_key": key_on(2)})), 2);
        assert_misplaced(
            refusal(
                "SELECT sheaf.enqueue_batch('q', ARRAY['{}'::jsonb], $1)",
                vec![pgrx::JsonB(json!({"idempotency_key": key_on(2)})).into()],
            ),
            2,
        );
        assert_eq!(
            enqueue(json!({"idempotency_key": key_on(2), "placement": {"shard": 1}})),
            None
        );
        assert_misplaced(enqueue(json!({"placement": {"shard": 2}})), 2);
        assert_eq!(enqueue(json!({})), None, "an unkeyed task goes anywhere");
        let run = crate::testing::start("wf", &owned_by(1), json!({})).id;
        assert_eq!(
            enqueue(json!({"idempotency_key": key_on(2), "execution_id": run.to_string()})),
            None,
            "a task of an execution is not placed by its key"
        );
    }

    /// A debounced start sent where its window is open joins it, even when
    /// its key's home is now another shard; it makes no new run there.
    #[pg_test]
    fn a_debounced_start_joins_its_open_window_but_opens_none_elsewhere() {
        init();
        publish(&json!({"shards": [1, 2]}));
        let sql = "SELECT sheaf.place_start('wf', 'x', jsonb_build_object('debounce', \
                   jsonb_build_object('key', $1::text, 'window', '1h')))";
        let [open, closed] = <[String; 2]>::try_from(keys_on(sql, "d", 2, 2)).unwrap();
        let debounced = |key: &str| json!({"debounce": {"key": key, "window": "1h"}});
        publish(&json!({"shards": [1]}));
        assert_eq!(
            start("a", debounced(&open)),
            None,
            "opened while this shard owned it"
        );
        publish(&json!({"shards": [1, 2]}));
        assert_eq!(start("b", debounced(&open)), None, "joins the open window");
        assert_misplaced(start("c", debounced(&closed)), 2);
    }

    row! {
        struct Misplaced {
            workflow_id: String,
            owner_shard: Option<i32>,
        }
    }

    row! {
        struct Accepted {
            digest: String,
            accepted_as: String,
        }
    }

    /// A run started before the topology placed its key elsewhere is
    /// listed with its owner; runs owned here, pinned here, or placed by a
    /// residency key the topology no longer has (owner unknown) are told
    /// apart.
    #[pg_test]
    fn misplaced_runs_lists_live_runs_the_topology_places_elsewhere() {
        init();
        publish(&json!({"shards": [1, 2]}));
        let (mine, theirs) = (owned_by(1), owned_by(2));
        publish(&json!({"shards": [1], "residency": {"eu": 1}}));
        for (id, opts) in [
            (&mine, json!({})),
            (&theirs, json!({})),
            (&"pinned".to_owned(), json!({"placement": {"shard": 1}})),
            (
                &"resident".to_owned(),
                json!({"placement": {"residency_key": "eu"}}),
            ),
        ] {
            assert_eq!(start(id, opts), None);
        }
        let listed = || {
            crate::testing::rows::<Misplaced>(
                "SELECT workflow_id, owner_shard FROM sheaf.misplaced_runs(10) ORDER BY workflow_id",
                &[],
            )
            .into_iter()
            .map(|m| (m.workflow_id, m.owner_shard))
            .collect::<Vec<_>>()
        };
        assert_eq!(listed(), vec![], "one shard owns everything");
        publish(&json!({"shards": [1, 2]}));
        assert_eq!(
            listed(),
            vec![("resident".to_owned(), None), (theirs.clone(), Some(2))]
        );
        // Ended runs are not misplaced.
        Spi::run_with_args(
            "SELECT sheaf.cancel_execution(id, 'done') FROM sheaf.executions WHERE workflow_id = $1",
            &[theirs.clone().into()],
        )
        .unwrap();
        assert_eq!(listed(), vec![("resident".to_owned(), None)]);
        let accepted = crate::testing::rows::<Accepted>(
            "SELECT digest, accepted_as FROM sheaf.topology_projections()",
            &[],
        );
        assert_eq!(accepted.len(), 1);
        assert_eq!(accepted[0].accepted_as, "current");
        assert!(accepted[0].digest.starts_with("sha256:"));
    }
}
