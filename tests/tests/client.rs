//! The client against three live shards: placement spreads and pins land
//! where the router says, ids name the shard that holds them, id-routed calls
//! reach that shard with no lookup, refusals are typed, and a shard the
//! client cannot use fails closed, by name.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, ExecutionId, ExecutionState, Json, Owned, Placement, PoolOptions,
    RouteError, ShardError, ShardId, StartOptions, TaskId, Topology,
};
use sheaf_tests::{connect, fleet, sid, unique};
use tokio_postgres::Client as Db;

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("pools for the fleet")
}

fn shard(n: u16) -> ShardId {
    ShardId::new(n as u32).unwrap()
}

/// A direct connection to every shard of the fleet, by id.
async fn databases() -> BTreeMap<u16, Db> {
    let mut dbs = BTreeMap::new();
    for s in fleet().shards() {
        dbs.insert(s.id.get(), connect(s).await);
    }
    dbs
}

/// Sends `name`'s workflow tasks to a queue of its own on every shard, so
/// this test's tasks never reach another test's claims (or theirs ours).
async fn declare(dbs: &BTreeMap<u16, Db>, name: &str) -> String {
    let queue = unique("client-q");
    for db in dbs.values() {
        db.execute(
            "SELECT sheaf.declare_workflow($1, $2)",
            &[&name, &json!({ "queue": queue })],
        )
        .await
        .unwrap();
    }
    queue
}

/// Which of `ids` each shard holds, asked of the shard itself by SQL.
async fn held(dbs: &BTreeMap<u16, Db>, ids: &[ExecutionId]) -> BTreeMap<u16, Vec<ExecutionId>> {
    let uuids: Vec<uuid::Uuid> = ids.iter().map(|i| i.as_uuid()).collect();
    let mut out = BTreeMap::new();
    for (&s, db) in dbs {
        let rows = db
            .query(
                "SELECT e.execution_id, sheaf.id_shard(e.execution_id) = sheaf.shard_id() \
                 FROM unnest($1::uuid[]) AS u(id), LATERAL sheaf.get_execution(u.id) AS e",
                &[&uuids],
            )
            .await
            .unwrap();
        let mut here = Vec::new();
        for row in rows {
            assert!(
                row.get::<_, bool>(1),
                "shard {s} holds an id minted for another shard"
            );
            here.push(ExecutionId::from_uuid(row.get(0)));
        }
        out.insert(s, here);
    }
    out
}

/// The state of `id` on shard `s`, read there directly.
async fn state_on(db: &Db, id: ExecutionId) -> Option<String> {
    db.query_opt("SELECT state FROM sheaf.get_execution($1)", &[&id.as_uuid()])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Claims one task of `queue` on a shard directly: (task id, token, execution id).
async fn claim(db: &Db, queue: &str) -> (TaskId, i64, Option<uuid::Uuid>) {
    let row = db
        .query_one(
            "SELECT task_id, token, execution_id FROM sheaf.claim($1, 'client-test', 1)",
            &[&queue],
        )
        .await
        .unwrap();
    (TaskId::from_uuid(row.get(0)), row.get(1), row.get(2))
}

#[tokio::test]
async fn auto_starts_spread_and_every_id_names_the_shard_that_holds_it() {
    const N: usize = 10_000;
    let client = client();
    let dbs = databases().await;
    let name = unique("spread");
    declare(&dbs, &name).await;

    let started: Vec<_> = futures::stream::iter(0..N)
        .map(|i| {
            let (client, name) = (&client, &name);
            async move {
                client
                    .start_workflow(name, &format!("w-{i}"), json!({ "i": i }), StartOptions::new())
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect()
        .await
        .unwrap();

    let mut per_shard: BTreeMap<u16, usize> = BTreeMap::new();
    for s in &started {
        assert!(s.created);
        assert_eq!(
            s.execution_id.shard(),
            Some(s.shard),
            "the id's prefix is its shard"
        );
        *per_shard.entry(s.shard.get()).or_default() += 1;
    }
    println!("{N} auto starts per shard: {per_shard:?}");
    assert_eq!(per_shard.len(), 3);
    // A third each, within 10% of it: about 7 standard deviations at 10K.
    for (s, n) in &per_shard {
        let share = *n as f64 / N as f64;
        assert!((0.30..=0.367).contains(&share), "shard {s} got {share:.3}");
    }

    // Through the client: each id routes to the shard that has it.
    let fetched: Vec<_> = futures::stream::iter(&started)
        .map(|s| client.get_execution(s.execution_id))
        .buffer_unordered(32)
        .try_collect()
        .await
        .unwrap();
    for e in fetched {
        let e = e.expect("every started execution is found by id");
        assert_eq!(e.execution_id.shard(), Some(e.shard));
        assert_eq!(e.workflow_name, name);
        assert_eq!(e.state, ExecutionState::Running);
    }

    // Directly: each shard holds exactly the ids the client put there.
    let ids: Vec<ExecutionId> = started.iter().map(|s| s.execution_id).collect();
    let held = held(&dbs, &ids).await;
    assert_eq!(held.values().map(Vec::len).sum::<usize>(), N, "each id held once");
    for (s, here) in held {
        assert_eq!(here.len(), per_shard[&s], "shard {s}");
        assert!(here.iter().all(|id| id.shard() == Some(shard(s))));
    }
}

#[tokio::test]
async fn pins_routing_keys_and_tenants_land_where_the_router_says() {
    let client = client();
    let dbs = databases().await;
    let name = unique("placed");
    declare(&dbs, &name).await;

    // A shard pin.
    for s in fleet().shards().map(|s| s.id.get()) {
        for i in 0..5 {
            let wid = format!("pin-{s}-{i}");
            let started = client
                .start_workflow(
                    &name,
                    &wid,
                    json!({}),
                    StartOptions::new().placement(Placement::Shard(sid(s))),
                )
                .await
                .unwrap();
            assert_eq!(started.shard.get(), s);
            assert_eq!(started.execution_id.shard(), Some(shard(s)));
            assert_eq!(
                state_on(&dbs[&s], started.execution_id).await.as_deref(),
                Some("RUNNING")
            );
        }
    }

    // A routing key: every start with it on one shard, whatever the names.
    let key = unique("tenant-key");
    let placement = Placement::RoutingKey(key.clone());
    let want = fleet().place("any", "any", &placement, None).unwrap();
    let mut ids = Vec::new();
    for i in 0..30 {
        let wf = format!("{name}-{}", i % 3);
        let s = client
            .start_workflow(
                &wf,
                &format!("rk-{i}"),
                json!({}),
                StartOptions::new().placement(placement.clone()),
            )
            .await
            .unwrap();
        assert_eq!(s.shard, want, "start {i}");
        ids.push(s.execution_id);
    }
    let held = held(&dbs, &ids).await;
    assert_eq!(
        held[&want.get()].len(),
        ids.len(),
        "all on the key's shard, by SQL"
    );

    // An ambient tenant: all its starts of one workflow on one shard.
    let tenant = unique("acme");
    let want = fleet()
        .place(&name, "x", &Placement::Auto, Some(&tenant))
        .unwrap();
    for i in 0..20 {
        let s = client
            .start_workflow(
                &name,
                &format!("t-{i}"),
                json!({}),
                StartOptions::new().tenant(&tenant),
            )
            .await
            .unwrap();
        assert_eq!(s.shard, want);
        assert_eq!(
            state_on(&dbs[&want.get()], s.execution_id).await.as_deref(),
            Some("RUNNING")
        );
    }
}

#[tokio::test]
async fn a_repeated_start_attaches_to_the_active_execution() {
    let client = client();
    let dbs = databases().await;
    let name = unique("attach");
    declare(&dbs, &name).await;

    let first = client
        .start_workflow(&name, "order-1", json!({ "n": 1 }), StartOptions::new())
        .await
        .unwrap();
    assert!(first.created);
    let again = client
        .start_workflow(&name, "order-1", json!({ "n": 2 }), StartOptions::new())
        .await
        .unwrap();
    assert!(!again.created, "attached");
    assert_eq!(again.execution_id, first.execution_id);
    assert_eq!(again.shard, first.shard);

    // Once it ended, the workflow id starts afresh.
    assert!(client.cancel_execution(first.execution_id, None).await.unwrap());
    let next = client
        .start_workflow(&name, "order-1", json!({}), StartOptions::new())
        .await
        .unwrap();
    assert!(next.created);
    assert_ne!(next.execution_id, first.execution_id);
}

/// Makes the next `fails` inserts of `name`'s executions on `db` fail with
/// 40P01, and every insert check that it carries the id the first one did
/// (a retry must reuse the minted id). Sequences are not transactional, so
/// they count attempts that rolled back.
async fn inject_deadlocks(db: &Db, name: &str, fails: i64) -> String {
    let tag = unique("inject").replace('-', "_");
    db.batch_execute(&format!(
        "CREATE SEQUENCE public.{tag}_attempts;
         CREATE SEQUENCE public.{tag}_first MINVALUE -2147483648 MAXVALUE 2147483647;
         CREATE FUNCTION public.{tag}_fn() RETURNS trigger LANGUAGE plpgsql AS $f$
         DECLARE n bigint := nextval('public.{tag}_attempts');
         BEGIN
             IF n = 1 THEN
                 PERFORM setval('public.{tag}_first', hashtext(NEW.id::text));
             ELSIF (SELECT last_value FROM public.{tag}_first) <> hashtext(NEW.id::text) THEN
                 RAISE EXCEPTION 'attempt % carries another execution id', n USING ERRCODE = 'XX000';
             END IF;
             IF n <= {fails} THEN
                 RAISE EXCEPTION 'injected deadlock (attempt %)', n USING ERRCODE = '40P01';
             END IF;
             RETURN NEW;
         END $f$;
         CREATE TRIGGER {tag}_trg BEFORE INSERT ON sheaf.executions FOR EACH ROW
             WHEN (NEW.workflow_name = '{name}') EXECUTE FUNCTION public.{tag}_fn();"
    ))
    .await
    .unwrap();
    tag
}

async fn attempts_and_remove(db: &Db, tag: &str) -> i64 {
    let n = db
        .query_one(&format!("SELECT last_value FROM public.{tag}_attempts"), &[])
        .await
        .unwrap()
        .get(0);
    db.batch_execute(&format!(
        "DROP TRIGGER {tag}_trg ON sheaf.executions;
         DROP FUNCTION public.{tag}_fn();
         DROP SEQUENCE public.{tag}_attempts, public.{tag}_first;"
    ))
    .await
    .unwrap();
    n
}

#[tokio::test]
async fn a_start_that_deadlocks_is_retried_with_the_same_id_then_reported() {
    let client = client();
    let dbs = databases().await;
    let s = 1u16;
    let db = &dbs[&s];

    // Two deadlocks, then it goes through: one execution, three attempts.
    let name = unique("deadlock");
    declare(&dbs, &name).await;
    let tag = inject_deadlocks(db, &name, 2).await;
    let started = client
        .start_workflow(
            &name,
            "d-1",
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(s))),
        )
        .await
        .unwrap();
    assert_eq!(attempts_and_remove(db, &tag).await, 3);
    assert!(started.created);
    assert_eq!(started.execution_id.shard(), Some(shard(s)));
    assert_eq!(
        state_on(db, started.execution_id).await.as_deref(),
        Some("RUNNING")
    );

    // Deadlocks every time: a bounded number of attempts, then Conflict.
    let name = unique("deadlock-always");
    declare(&dbs, &name).await;
    let tag = inject_deadlocks(db, &name, i64::MAX).await;
    let began = std::time::Instant::now();
    let e = client
        .start_workflow(
            &name,
            "d-2",
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(s))),
        )
        .await
        .unwrap_err();
    let attempts = attempts_and_remove(db, &tag).await;
    match e {
        ClientError::Conflict {
            shard: at,
            attempts: n,
            ..
        } => {
            assert_eq!(at, shard(s));
            assert_eq!(n as i64, attempts);
            assert!((2..=10).contains(&n), "{n} attempts");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    // Loose on purpose (a few ms per attempt are expected): it catches a
    // backoff of seconds per attempt, not a slow machine.
    assert!(began.elapsed() < Duration::from_secs(20), "the backoff is small");
    let none = db
        .query_opt("SELECT 1 FROM sheaf.find_execution($1, 'd-2')", &[&name])
        .await
        .unwrap();
    assert!(none.is_none(), "nothing was written");
}

// A scenario reads top to bottom as one story (set up, race, check);
// split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn id_routed_calls_reach_the_shard_in_the_id() {
    let client = client();
    let dbs = databases().await;
    let name = unique("routed");
    let queue = declare(&dbs, &name).await;
    let tasks = unique("client-tasks");

    for s in fleet().shards().map(|s| s.id.get()) {
        let db = &dbs[&s];
        let others: Vec<&Db> = dbs.iter().filter(|(k, _)| **k != s).map(|(_, d)| d).collect();

        // get, then complete an execution through its id.
        let e1 = client
            .start_workflow(
                &name,
                &format!("e1-{s}"),
                json!({ "s": s }),
                StartOptions::new().placement(Placement::Shard(sid(s))),
            )
            .await
            .unwrap()
            .execution_id;
        let got = client.get_execution(e1).await.unwrap().expect("found by id");
        assert_eq!((got.shard.get(), got.state), (s, ExecutionState::Running));
        assert_eq!(got.input.to_value().unwrap(), json!({ "s": s }));

        // Its workflow task: heartbeat, a stale complete, the real one.
        let (task, token, owner) = claim(db, &queue).await;
        assert_eq!(owner, Some(e1.as_uuid()));
        assert_eq!(task.shard(), Some(shard(s)), "task ids carry the shard too");
        let lease_end = client.heartbeat(task, token).await.unwrap();
        assert!(lease_end > SystemTime::now());
        let stale = client.complete(task, token + 1, None).await.unwrap_err();
        assert!(
            matches!(stale, ClientError::StaleToken { shard: at, .. } if at == shard(s)),
            "{stale:?}"
        );
        client
            .complete(task, token, Some(json!({ "step": 1 }).into()))
            .await
            .unwrap();
        // Finished, it is gone: an unknown task, not a lost lease.
        assert!(matches!(
            client.complete(task, token, None).await,
            Err(ClientError::UnknownTask { .. })
        ));
        assert!(matches!(
            client.heartbeat(task, token).await,
            Err(ClientError::UnknownTask { .. })
        ));

        assert!(client.complete_execution(e1, json!({ "done": s })).await.unwrap());
        assert!(
            !client.complete_execution(e1, json!(null)).await.unwrap(),
            "already ended"
        );
        let got = client.get_execution(e1).await.unwrap().unwrap();
        assert_eq!(got.state, ExecutionState::Completed);
        assert_eq!(
            got.result.map(|r| r.to_value().unwrap()),
            Some(json!({ "done": s }))
        );
        assert!(got.closed_at.is_some());
        assert_eq!(state_on(db, e1).await.as_deref(), Some("COMPLETED"));

        // cancel through the id; only that shard has it.
        let e2 = client
            .start_workflow(
                &name,
                &format!("e2-{s}"),
                json!({}),
                StartOptions::new().placement(Placement::Shard(sid(s))),
            )
            .await
            .unwrap()
            .execution_id;
        assert!(client.cancel_execution(e2, Some("test")).await.unwrap());
        assert!(!client.cancel_execution(e2, None).await.unwrap());
        assert_eq!(state_on(db, e2).await.as_deref(), Some("CANCELLED"));
        for other in &others {
            assert_eq!(state_on(other, e2).await, None);
        }

        // fail: a retry, then a dead letter.
        let twice: Value = json!({ "max_attempts": 2 });
        let once: Value = json!({ "max_attempts": 1 });
        for opts in [&twice, &once] {
            db.execute("SELECT sheaf.enqueue($1, '{}', $2)", &[&tasks, opts])
                .await
                .unwrap();
        }
        let (t, token, _) = claim(db, &tasks).await;
        let before = SystemTime::now();
        let outcome = client
            .fail(t, token, "boom", Some(Duration::from_secs(60)))
            .await
            .unwrap();
        assert!(!outcome.dead_lettered);
        let retry_at = outcome.retry_at.expect("a retry time");
        assert!(retry_at > before + Duration::from_secs(55) && retry_at < before + Duration::from_secs(65));
        let (t, token, _) = claim(db, &tasks).await;
        let outcome = client.fail(t, token, "boom", None).await.unwrap();
        assert!(outcome.dead_lettered && outcome.retry_at.is_none());

        // An id this shard never minted: typed, not a silent None elsewhere.
        let ghost = ExecutionId::mint(shard(s)).unwrap();
        assert_eq!(client.get_execution(ghost).await.unwrap(), None);
        assert!(matches!(
            client.cancel_execution(ghost, None).await,
            Err(ClientError::UnknownExecution { shard: at, .. }) if at == shard(s)
        ));
    }
}

/// A client that knows only shards 0 and 1 of the fleet.
fn partial_client() -> Client {
    let t = fleet()
        .shards()
        .filter(|s| s.id.get() < 2)
        .fold(Topology::builder(), |b, s| {
            b.shard(s.id.get() as u32, s.url.clone())
        })
        .build()
        .unwrap();
    Client::new(t, PoolOptions::default()).unwrap()
}

#[tokio::test]
async fn a_shard_outside_the_clients_topology_fails_closed() {
    let full = client();
    let partial = partial_client();
    let dbs = databases().await;
    let name = unique("closed");
    declare(&dbs, &name).await;

    // A pin to it: refused, typed, nothing written anywhere.
    let e = partial
        .start_workflow(
            &name,
            "p-1",
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(2))),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Route(RouteError::UnknownShard(s)) if *s == sid(2)),
        "{e:?}"
    );
    let shown = e.to_string();
    for leak in ["0", "1", "2"] {
        assert!(!shown.contains(leak), "{shown:?} lists shards");
    }
    for db in dbs.values() {
        let row = db
            .query_opt("SELECT 1 FROM sheaf.find_execution($1, 'p-1')", &[&name])
            .await
            .unwrap();
        assert!(row.is_none());
    }

    // An id of it: no pool, so no call, and never another shard.
    let on_two = full
        .start_workflow(
            &name,
            "p-2",
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(2))),
        )
        .await
        .unwrap()
        .execution_id;
    let e = partial.get_execution(on_two).await.unwrap_err();
    match &e {
        ClientError::Shard {
            owned: Owned::Execution(id),
            error: ShardError::NoPool { shard: at },
        } => assert_eq!((*id, *at), (on_two, shard(2))),
        other => panic!("expected no pool for shard 2, got {other:?}"),
    }
    let shown = e.to_string();
    assert!(
        shown.contains("shard 2") && shown.contains(&on_two.to_string()),
        "{shown}"
    );
    assert!(
        !shown.contains("shard 0") && !shown.contains("shard 1"),
        "{shown}"
    );
    assert!(matches!(
        partial.cancel_execution(on_two, None).await,
        Err(ClientError::Shard { .. })
    ));
    assert_eq!(state_on(&dbs[&2], on_two).await.as_deref(), Some("RUNNING"));
}

#[tokio::test]
async fn an_unreachable_shard_names_itself_and_the_work_it_owns() {
    let zero = fleet().shards().next().unwrap();
    let t = Topology::builder()
        .shard(zero.id.get() as u32, zero.url.clone())
        .shard(5, "postgres://postgres@127.0.0.1:1/sheaf")
        .build()
        .unwrap();
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(1));
    let client = Client::new(t, options).unwrap();
    let name = unique("unreachable");
    declare(&databases().await, &name).await;

    let e = client
        .start_workflow(
            &name,
            "u-1",
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(5))),
        )
        .await
        .unwrap_err();
    match &e {
        ClientError::Shard {
            owned: Owned::Workflow { name: n, workflow_id },
            error: ShardError::Unreachable { shard: at, .. },
        } => assert_eq!(
            (n.as_str(), workflow_id.as_str(), *at),
            (name.as_str(), "u-1", shard(5))
        ),
        other => panic!("expected shard 5 unreachable, got {other:?}"),
    }
    let shown = e.to_string();
    assert!(shown.contains("shard 5") && shown.contains(&name), "{shown}");
    assert!(
        !shown.contains(&format!("shard {}", zero.id)),
        "names one shard: {shown}"
    );

    let id = ExecutionId::mint(shard(5)).unwrap();
    let e = client.cancel_execution(id, None).await.unwrap_err();
    assert!(e.to_string().contains(&id.to_string()), "{e}");

    // The reachable shard keeps serving.
    let s = client
        .start_workflow(
            &name,
            "u-2",
            json!({}),
            StartOptions::new().placement(Placement::Shard(zero.id)),
        )
        .await
        .unwrap();
    assert!(s.created);
    assert_eq!(
        client.get_execution(s.execution_id).await.unwrap().unwrap().shard,
        zero.id
    );
}

/// A payload is the caller's data: through the client, into a shard and back
/// out of a claim, every digit and the scale of every number survive.
#[tokio::test]
async fn payloads_keep_every_digit_through_the_client() {
    let client = client();
    let queue = unique("exact");
    let text = r#"{"amount": 12345678901234567890123.000000000001, "rate": 1.50}"#;
    let payload = Json::parse(text).unwrap();
    let sent = client
        .enqueue(&queue, payload, EnqueueOptions::new())
        .await
        .unwrap();
    let got = client
        .claim(sent.shard, &queue, "exact-test", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // The shard prints jsonb its own way (key order, spacing), every digit kept.
    let back = got[0].payload.as_str();
    assert!(back.contains("12345678901234567890123.000000000001"), "{back}");
    assert!(back.contains("1.50"), "{back}");
}

/// A worker's steady state in one call: the first call only claims, the
/// next completes what it was given and claims the rest; a stale token is
/// reported `false` without stopping the claim, and every task is done
/// once.
#[tokio::test]
async fn complete_and_claim_finishes_a_batch_and_claims_the_next() {
    let client = client();
    let queue = unique("fused");
    let options = EnqueueOptions::new().placement(Placement::Shard(sid(0)));
    let sent = client
        .enqueue_batch(&queue, (0..5).map(|i| json!({ "n": i })), options)
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let (done, first) = client
        .complete_and_claim(sent.shard, &queue, "fused-test", &[], 3, lease)
        .await
        .unwrap();
    assert!(done.is_empty());
    assert_eq!(first.len(), 3);
    let mut finished: Vec<(TaskId, i64)> = first.iter().map(|t| (t.task_id, t.token)).collect();
    finished[1].1 += 1; // a lease lost meanwhile
    let (done, next) = client
        .complete_and_claim(sent.shard, &queue, "fused-test", &finished, 3, lease)
        .await
        .unwrap();
    let expect: Vec<(TaskId, bool)> = finished.iter().enumerate().map(|(i, t)| (t.0, i != 1)).collect();
    assert_eq!(done, expect, "each finished task in input order");
    assert_eq!(next.len(), 2, "the two tasks left");
    let mut rest: Vec<(TaskId, i64)> = next.iter().map(|t| (t.task_id, t.token)).collect();
    rest.push((first[1].task_id, first[1].token));
    let (done, none) = client
        .complete_and_claim(sent.shard, &queue, "fused-test", &rest, 3, lease)
        .await
        .unwrap();
    assert!(done.iter().all(|d| d.1), "{done:?}");
    assert!(none.is_empty());
    let ids: std::collections::BTreeSet<TaskId> = first.iter().chain(&next).map(|t| t.task_id).collect();
    assert_eq!(
        ids,
        sent.task_ids.iter().copied().collect(),
        "each task claimed once"
    );
}

/// A running task an operator cancels while its completion waits for the
/// next claim: the fused call reports it not completed (its token was
/// fenced) and claims on; the worker's `release` then ends it cancelled.
#[tokio::test]
async fn complete_and_claim_reports_a_cancelled_task_and_claims_on() {
    let client = client();
    let queue = unique("fused-cancel");
    let options = EnqueueOptions::new().placement(Placement::Shard(sid(0)));
    let sent = client
        .enqueue_batch(&queue, (0..2).map(|i| json!({ "n": i })), options)
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let (_, first) = client
        .complete_and_claim(sent.shard, &queue, "fused-cancel", &[], 1, lease)
        .await
        .unwrap();
    let running = (first[0].task_id, first[0].token);
    assert!(client.cancel_task(running.0, Some("not needed")).await.unwrap());
    let (done, next) = client
        .complete_and_claim(sent.shard, &queue, "fused-cancel", &[running], 1, lease)
        .await
        .unwrap();
    assert_eq!(done, vec![(running.0, false)], "fenced by the cancel");
    assert_eq!(next.len(), 1, "the claim went on");
    assert_ne!(next[0].task_id, running.0);
    client.release(running.0, running.1).await.unwrap();
    let db = connect(fleet().shards().next().unwrap()).await;
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.tasks WHERE id = $1",
            &[&running.0.as_uuid()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "released: it ended, cancelled");
}

/// A task with no affinity goes to a shard that can take it now: with one
/// of four shards down, every enqueue lands on the other three (it used to
/// fail whenever the random pick was the dead one). With every shard down
/// it fails, typed, naming only the last shard it tried.
#[tokio::test]
async fn tasks_with_no_affinity_pass_over_a_dead_shard() {
    let mut b = Topology::builder();
    for s in fleet().shards() {
        b = b.shard(s.id.get() as u32, s.url.clone());
    }
    let t = b
        .shard(9, "postgres://postgres@127.0.0.1:1/sheaf")
        .build()
        .unwrap();
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(1));
    let client = Client::new(t, options.clone()).unwrap();
    let queue = unique("anywhere");
    let mut per_shard: BTreeMap<u16, usize> = BTreeMap::new();
    for n in 0..40 {
        let e = client
            .enqueue(&queue, json!({"n": n}), EnqueueOptions::new())
            .await
            .unwrap_or_else(|e| panic!("enqueue {n}: {e}"));
        *per_shard.entry(e.shard.get()).or_default() += 1;
    }
    assert!(!per_shard.contains_key(&9), "{per_shard:?}");
    assert_eq!(per_shard.values().sum::<usize>(), 40);
    assert!(per_shard.len() >= 2, "spread over the live shards: {per_shard:?}");

    let dead = Topology::builder()
        .shard(8, "postgres://postgres@127.0.0.1:1/sheaf")
        .shard(9, "postgres://postgres@127.0.0.1:2/sheaf")
        .build()
        .unwrap();
    let client = Client::new(dead, options).unwrap();
    let e = client
        .enqueue(&queue, json!({}), EnqueueOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::NoShardAvailable { .. }), "{e:?}");
}

/// One error kind per kind of mistake: an execution id that names no
/// execution is `UnknownExecution` for an enqueue too, and a task id that
/// never existed is `UnknownTask`, not a lost lease.
#[tokio::test]
async fn unknown_ids_are_unknown_everywhere() {
    let client = client();
    let on = fleet().shards().next().expect("a shard").id;
    let nobody = ExecutionId::mint(on).unwrap();
    let e = client
        .enqueue(
            &unique("unknown"),
            json!({}),
            EnqueueOptions::new().execution(nobody),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::UnknownExecution { shard, .. } if shard == on),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    let e = client.cancel_execution(nobody, None).await.unwrap_err();
    assert!(matches!(e, ClientError::UnknownExecution { .. }), "{e:?}");
    let never = TaskId::mint(on).unwrap();
    for e in [
        client.complete(never, 1, None).await.unwrap_err(),
        client.fail(never, 1, "x", None).await.map(|_| ()).unwrap_err(),
        client.heartbeat(never, 1).await.map(|_| ()).unwrap_err(),
        client.release(never, 1).await.unwrap_err(),
    ] {
        assert!(matches!(e, ClientError::UnknownTask { .. }), "{e:?}");
        assert!(!e.to_string().contains("lease"), "{e}");
    }
}

/// A quota refusal carries what was exceeded, as fields.
#[tokio::test]
async fn a_quota_refusal_says_what_was_exceeded() {
    let client = client();
    let on = fleet().shards().next().expect("a shard").id;
    let db = connect(fleet().get(on).unwrap()).await;
    let name = unique("quota-detail");
    let policy = json!({ "quota": { "key": "input.tenant", "max_active_executions": 1 } });
    db.execute("SELECT sheaf.declare_workflow($1, $2)", &[&name, &policy])
        .await
        .unwrap();
    let pinned = || StartOptions::new().placement(Placement::Shard(on));
    // Quota keys are shared across workflows: one of this test's own.
    let tenant = unique("tenant");
    client
        .start_workflow(&name, "a", json!({ "tenant": &tenant }), pinned())
        .await
        .unwrap();
    let e = client
        .start_workflow(&name, "b", json!({ "tenant": &tenant }), pinned())
        .await
        .unwrap_err();
    match &e {
        ClientError::QuotaExceeded { detail: Some(d), .. } => {
            assert_eq!(
                (
                    d.workflow.as_str(),
                    d.key.as_str(),
                    d.resource.as_str(),
                    d.limit,
                    d.usage
                ),
                (name.as_str(), tenant.as_str(), "max_active_executions", 1, 1)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(e.is_retryable(), "a quota frees up as executions end");
}
