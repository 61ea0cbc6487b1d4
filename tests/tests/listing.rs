//! Listing and finding executions across four live shards: 10K executions
//! over random workflows, states and search attributes; paging through
//! everything in both orders while starts and state changes go on; every
//! filter form against a reference evaluation written here; cursors and
//! filters the listing refuses; `find_execution` with a stale ended run on
//! one shard and the live run on another; and a stopped shard (a real
//! cluster stopped here): a partial page naming it, exact rows from the
//! others, an `Indeterminate` find; and the counts by state
//! (`count_executions`) of every filter, capped and partial. Runs its own
//! four shards.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use sheaf_driver::{
    Client, ClientError, ExecutionFilter, ExecutionState, ListedExecution, PageStatus, Placement,
    PoolOptions, Resolution, ShardId, SortOrder, StartOptions, Topology,
};
use sheaf_tests::{Rng, connect};

const SHARDS: u32 = 4;
const PER_SHARD: usize = 2_500;
const WORKFLOWS: [&str; 5] = ["billing", "ingest", "report", "sync", "mail"];

fn shards(args: &[&str]) -> String {
    sheaf_tests::own_shards("listing", 25600, args)
}

/// One execution as its shard holds it: the ground truth.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    id: uuid::Uuid,
    shard: u16,
    micros: i64,
    workflow: String,
    state: String,
    attrs: Value,
}

/// Every execution of every shard of `topology` (or of `only`), read
/// straight from the databases.
async fn ground_truth(topology: &Topology, only: Option<&[u16]>) -> Vec<Row> {
    let mut rows = Vec::new();
    for shard in topology.shards() {
        if only.is_some_and(|o| !o.contains(&shard.id.get())) {
            continue;
        }
        let db = connect(shard).await;
        for r in db
            .query(
                "SELECT id, (extract(epoch FROM created_at) * 1000000)::int8, workflow_name, state, search_attrs \
                 FROM sheaf.executions",
                &[],
            )
            .await
            .expect("read executions")
        {
            rows.push(Row {
                id: r.get(0),
                shard: shard.id.get(),
                micros: r.get(1),
                workflow: r.get(2),
                state: r.get(3),
                attrs: r.get(4),
            });
        }
    }
    rows
}

fn random_attrs(rng: &mut Rng) -> Value {
    let mut m = serde_json::Map::new();
    match rng.below(20) {
        0 => {
            m.insert("tenant".into(), json!(7));
        }
        1..=3 => {}
        n => {
            m.insert("tenant".into(), json!(format!("t{}", n % 10)));
        }
    }
    if rng.below(10) < 7 {
        m.insert("n".into(), json!(rng.below(100)));
    }
    if rng.below(2) == 0 {
        m.insert("score".into(), json!(rng.below(40) as f64 / 4.0));
    }
    if rng.below(2) == 0 {
        m.insert("vip".into(), json!(rng.below(2) == 0));
    }
    if rng.below(100) == 0 {
        // 1%-selective: the attribute the selective filters look for.
        m.insert("rare".into(), json!("yes"));
    }
    m.insert("region".into(), json!(["eu", "us", "ap"][rng.below(3) as usize]));
    Value::Object(m)
}

/// Starts `count` executions on one shard in batches of 100 (one
/// transaction, one `created_at`, each: ties broken by id), then moves a
/// random fifth of them to an ended state.
async fn populate(db: &tokio_postgres::Client, rng: &mut Rng, tag: &str, count: usize) {
    for batch in 0..count.div_ceil(100) {
        let docs: Vec<Value> = (0..100.min(count - batch * 100))
            .map(|i| {
                json!({
                    "name": WORKFLOWS[rng.below(WORKFLOWS.len() as u64) as usize],
                    "id": format!("{tag}-{batch}-{i}"),
                    "attrs": random_attrs(rng),
                })
            })
            .collect();
        db.execute(
            "SELECT count(*) FROM jsonb_to_recordset($1::jsonb) AS w(name text, id text, attrs jsonb), \
             LATERAL sheaf.start_workflow(w.name, w.id, '{}', jsonb_build_object('search_attrs', w.attrs))",
            &[&Value::Array(docs)],
        )
        .await
        .expect("start a batch");
    }
    let seed = rng.next_u64() as f64 / u64::MAX as f64;
    db.batch_execute(&format!(
        "SELECT setseed({seed}); \
         SELECT CASE WHEN r < 0.1 THEN sheaf.cancel_execution(id, 'test') \
                     WHEN r < 0.15 THEN sheaf.fail_execution(id, 'test') \
                     ELSE sheaf.complete_execution(id, '{{}}') END \
         FROM (SELECT id, random() AS r FROM sheaf.executions WHERE state = 'RUNNING') e WHERE r < 0.2"
    ))
    .await
    .expect("end some");
}

/// Pages through everything under `filter` in `order`; the rows in the
/// order returned, checking each page's size and that no page is partial.
async fn page_all(
    client: &Client,
    filter: &ExecutionFilter,
    order: SortOrder,
    page_size: usize,
) -> Vec<ListedExecution> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_executions(filter, cursor.as_deref(), page_size, order)
            .await
            .unwrap_or_else(|e| panic!("list {}: {e}", filter.to_json()));
        assert_eq!(page.status, PageStatus::Complete, "{:?}", page.unavailable_shards);
        assert!(page.items.len() <= page_size);
        if page.next_cursor.is_some() {
            assert_eq!(page.items.len(), page_size, "a page before the last is full");
        }
        all.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return all,
        }
    }
}

fn key(e: &ListedExecution) -> (i64, uuid::Uuid) {
    let micros = e
        .created_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64;
    (micros, e.execution_id.as_uuid())
}

fn assert_ordered(rows: &[ListedExecution], order: SortOrder) {
    for w in rows.windows(2) {
        let (a, b) = (key(&w[0]), key(&w[1]));
        let ok = match order {
            SortOrder::Desc => a > b,
            SortOrder::Asc => a < b,
        };
        assert!(ok, "out of order or repeated: {a:?} then {b:?} ({order:?})");
    }
}

/// The reference: what a filter selects, evaluated here on the ground
/// truth, independently of the SQL the shards run.
fn matches(filter: &Value, row: &Row) -> bool {
    let m = filter.as_object().expect("an object");
    if m.is_empty() {
        return true;
    }
    if let Some(parts) = m.get("and") {
        return parts.as_array().expect("and").iter().all(|p| matches(p, row));
    }
    if let Some(parts) = m.get("or") {
        return parts.as_array().expect("or").iter().any(|p| matches(p, row));
    }
    if let Some(inner) = m.get("not") {
        return !matches(inner, row);
    }
    if let Some(states) = m.get("state") {
        return states
            .as_array()
            .expect("states")
            .iter()
            .any(|s| s == row.state.as_str());
    }
    if let Some(names) = m.get("workflow_name") {
        return names
            .as_array()
            .expect("names")
            .iter()
            .any(|s| s == row.workflow.as_str());
    }
    let key = m["attr"].as_str().expect("attr key");
    let have = row.attrs.get(key);
    let op = m["op"].as_str().expect("op");
    if op == "exists" {
        return have.is_some();
    }
    let Some(have) = have else { return false };
    if op == "in" {
        return m["value"]
            .as_array()
            .expect("in")
            .iter()
            .any(|v| same(have, v) == Some(std::cmp::Ordering::Equal));
    }
    let Some(c) = same(have, &m["value"]) else {
        return false;
    };
    match op {
        "=" => c.is_eq(),
        "!=" => c.is_ne(),
        "<" => c.is_lt(),
        "<=" => c.is_le(),
        ">" => c.is_gt(),
        ">=" => c.is_ge(),
        other => panic!("op {other}"),
    }
}

/// A typed comparison: `None` across JSON types.
fn same(have: &Value, want: &Value) -> Option<std::cmp::Ordering> {
    match (have, want) {
        (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?),
        (Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    }
}

fn filters() -> Vec<Value> {
    vec![
        json!({}),
        json!({"state": ["RUNNING"]}),
        json!({"state": ["CANCELLED", "FAILED"]}),
        json!({"workflow_name": ["billing"]}),
        json!({"workflow_name": ["sync", "mail"]}),
        json!({"attr": "tenant", "op": "=", "value": "t3"}),
        json!({"attr": "tenant", "op": "=", "value": 7}),
        json!({"attr": "tenant", "op": "!=", "value": "t3"}),
        json!({"attr": "tenant", "op": "in", "value": ["t1", "t2", 7]}),
        json!({"attr": "tenant", "op": "exists"}),
        json!({"attr": "n", "op": "<", "value": 10}),
        json!({"attr": "n", "op": ">=", "value": 90}),
        json!({"attr": "score", "op": "<=", "value": 2.5}),
        json!({"attr": "score", "op": ">", "value": 9}),
        json!({"attr": "region", "op": "<", "value": "eu"}),
        json!({"attr": "region", "op": ">=", "value": "us"}),
        json!({"attr": "vip", "op": "=", "value": true}),
        json!({"attr": "vip", "op": "!=", "value": true}),
        json!({"attr": "rare", "op": "=", "value": "yes"}),
        json!({"not": {"attr": "tenant", "op": "exists"}}),
        json!({"not": {"state": ["RUNNING", "COMPLETED"]}}),
        json!({"and": [{"state": ["RUNNING"]}, {"attr": "n", "op": ">", "value": 50}, {"workflow_name": ["ingest", "report"]}]}),
        json!({"or": [{"attr": "rare", "op": "exists"}, {"and": [{"state": ["FAILED"]}, {"attr": "vip", "op": "=", "value": false}]}]}),
        json!({"or": [{"workflow_name": ["mail"]}, {"attr": "tenant", "op": "in", "value": ["t9"]}, {"state": ["CANCELLED"]}]}),
        json!({"and": [{"not": {"or": [{"state": ["RUNNING"]}, {"attr": "region", "op": "=", "value": "eu"}]}}, {"attr": "score", "op": "exists"}]}),
    ]
}

/// `rows` counted by state as `count_executions` sums them: each shard's
/// count of a state bounded by `cap`, `capped` when one had more.
fn by_state(rows: &[&Row], cap: u64) -> BTreeMap<String, (u64, bool)> {
    let mut per_shard: BTreeMap<(String, u16), u64> = BTreeMap::new();
    for r in rows {
        *per_shard.entry((r.state.clone(), r.shard)).or_default() += 1;
    }
    let mut out: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    for ((state, _), n) in per_shard {
        let e = out.entry(state).or_default();
        e.0 += n.min(cap);
        e.1 |= n > cap;
    }
    out
}

/// The client's counts of `filter` up to `cap` (the states with a count),
/// and the shards that did not answer.
async fn counted(
    client: &Client,
    filter: &ExecutionFilter,
    cap: u32,
) -> (BTreeMap<String, (u64, bool)>, Vec<u16>) {
    let c = client.count_executions(filter, cap).await.expect("counts");
    assert_eq!(c.status == PageStatus::Partial, !c.unavailable_shards.is_empty());
    let counts = c
        .counts
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| (c.state.as_str().to_owned(), (c.count, c.capped)))
        .collect();
    (counts, c.unavailable_shards.keys().map(|s| s.get()).collect())
}

// A scenario reads top to bottom as one story (set up, page under churn,
// check every filter, stop a shard); split, it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_and_finding_across_four_shards() {
    let topology = Topology::parse(&shards(&["up", "--count", &SHARDS.to_string(), "--no-install"])).unwrap();
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2));
    let client = Arc::new(Client::new(topology.clone(), options).unwrap());
    let (mut rng, seed) = Rng::from_time();
    eprintln!("seed {seed}");
    let started = std::time::Instant::now();
    let fills = topology.shards().map(|shard| {
        let mut rng = Rng::new(rng.next_u64());
        async move {
            let db = connect(shard).await;
            populate(&db, &mut rng, &format!("s{}", shard.id), PER_SHARD).await;
        }
    });
    futures::future::join_all(fills).await;
    eprintln!(
        "{} executions in {:?}",
        PER_SHARD * SHARDS as usize,
        started.elapsed()
    );

    // Paging under churn: everything committed before the first page is
    // listed exactly once, in order; later starts may appear, never twice.
    let before = ground_truth(&topology, None).await;
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (topology, stop) = (topology.clone(), stop.clone());
        let mut rng = Rng::new(rng.next_u64());
        tokio::spawn(async move {
            let dbs = futures::future::join_all(topology.shards().map(connect)).await;
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let db = &dbs[rng.below(dbs.len() as u64) as usize];
                populate(db, &mut rng, &format!("churn{round}"), 20).await;
                round += 1;
            }
            round
        })
    };
    for order in [SortOrder::Desc, SortOrder::Asc] {
        let listed = page_all(&client, &ExecutionFilter::new(), order, 97).await;
        assert_ordered(&listed, order);
        let seen: BTreeSet<uuid::Uuid> = listed.iter().map(|e| e.execution_id.as_uuid()).collect();
        assert_eq!(seen.len(), listed.len(), "listed twice");
        let missing = before.iter().filter(|r| !seen.contains(&r.id)).count();
        assert_eq!(
            missing,
            0,
            "{missing} of {} committed before the first page were never listed ({order:?})",
            before.len()
        );
        for e in &listed {
            assert_eq!(
                e.execution_id.shard(),
                Some(e.shard),
                "the row's shard is the one its id names"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.await.expect("the churn");
    eprintln!("paged both orders under {rounds} rounds of churn");

    // Every filter form, against the reference.
    let truth = ground_truth(&topology, None).await;
    for tree in filters() {
        let filter = ExecutionFilter::from_json(tree.clone());
        let mut want: Vec<&Row> = truth.iter().filter(|r| matches(&tree, r)).collect();
        want.sort_by_key(|r| std::cmp::Reverse((r.micros, r.id)));
        let got = page_all(&client, &filter, SortOrder::Desc, 500).await;
        let got_ids: Vec<uuid::Uuid> = got.iter().map(|e| e.execution_id.as_uuid()).collect();
        let want_ids: Vec<uuid::Uuid> = want.iter().map(|r| r.id).collect();
        assert_eq!(
            got_ids.len(),
            want_ids.len(),
            "{tree}: {} listed, {} match",
            got_ids.len(),
            want_ids.len()
        );
        assert_eq!(got_ids, want_ids, "{tree}");
        for (e, r) in got.iter().zip(&want) {
            assert_eq!(e.search_attrs.to_value().unwrap(), r.attrs, "{tree}");
            assert_eq!(e.state.as_str(), r.state, "{tree}");
        }
        // Its counts by state: exact under a cap no shard reaches.
        assert_eq!(
            counted(&client, &filter, 1_000_000).await,
            (by_state(&want, u64::MAX), vec![]),
            "{tree}: counts"
        );
        eprintln!("{tree}: {} rows", got.len());
    }
    // A small cap bounds each shard's count of each state.
    let everything: Vec<&Row> = truth.iter().collect();
    let capped = counted(&client, &ExecutionFilter::new(), 100).await;
    assert_eq!(capped, (by_state(&everything, 100), vec![]));
    assert!(
        capped.0.values().any(|(_, c)| *c),
        "a state over the cap: {capped:?}"
    );
    assert!(matches!(
        client.count_executions(&ExecutionFilter::new(), 0).await,
        Err(ClientError::BadRequest(_))
    ));

    // Refusals: a cursor of another filter or order, a garbled one, a bad
    // page size, an or that would scan.
    let all = ExecutionFilter::new();
    let first = client
        .list_executions(&all, None, 10, SortOrder::Desc)
        .await
        .expect("a page");
    let cursor = first.next_cursor.expect("more than 10");
    let running = ExecutionFilter::new().states([ExecutionState::Running]);
    for (filter, order, text) in [
        (&running, SortOrder::Desc, cursor.as_str()),
        (&all, SortOrder::Asc, cursor.as_str()),
        (&all, SortOrder::Desc, "v1.d.x"),
        (
            &all,
            SortOrder::Desc,
            "v9.d.1.00000000000000000000000000000000.0000000000000000",
        ),
    ] {
        let e = client
            .list_executions(filter, Some(text), 10, order)
            .await
            .expect_err("refused");
        assert!(matches!(e, ClientError::BadRequest(_)), "{e}");
    }
    for size in [0, 1000] {
        assert!(matches!(
            client.list_executions(&all, None, size, SortOrder::Desc).await,
            Err(ClientError::BadRequest(_))
        ));
    }
    let scan = ExecutionFilter::from_json(
        json!({"or": [{"state": ["RUNNING"]}, {"attr": "n", "op": ">", "value": 3}]}),
    );
    let e = client
        .list_executions(&scan, None, 10, SortOrder::Desc)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("filter.or[1]"), "{e}");

    // find_execution: a stale ended run on shard 0, the live one on shard 2.
    let on = |n: u32| StartOptions::new().placement(Placement::Shard(ShardId::new(n).unwrap()));
    let old = client
        .start_workflow("orders", "order-42", json!({}), on(0))
        .await
        .expect("start");
    client
        .cancel_execution(old.execution_id, None)
        .await
        .expect("cancel");
    let live = client
        .start_workflow("orders", "order-42", json!({}), on(2))
        .await
        .expect("start");
    let Resolution::Found { execution, shard, .. } =
        client.find_execution("orders", "order-42").await.expect("find")
    else {
        panic!("order-42 not found");
    };
    assert_eq!((execution.execution_id, shard.get()), (live.execution_id, 2));
    assert_eq!(execution.state, ExecutionState::Running);
    assert!(matches!(
        client.find_execution("orders", "order-43").await.expect("find"),
        Resolution::Absent
    ));

    // Shard 2 stopped: a partial page naming it, the others' rows exact; the
    // find cannot say where order-42 runs.
    shards(&["stop-one", "2"]);
    let others = ground_truth(&topology, Some(&[0, 1, 3])).await;
    let mut want: Vec<(i64, uuid::Uuid)> = others.iter().map(|r| (r.micros, r.id)).collect();
    want.sort_by_key(|k| std::cmp::Reverse(*k));
    let mut got = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_executions(&all, cursor.as_deref(), 999, SortOrder::Desc)
            .await
            .expect("a partial page");
        assert_eq!(page.status, PageStatus::Partial);
        assert_eq!(
            page.unavailable_shards
                .keys()
                .map(|s| s.get())
                .collect::<Vec<_>>(),
            vec![2]
        );
        got.extend(page.items.iter().map(key));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(got, want, "the answering shards' rows, exactly");
    let answering: Vec<&Row> = others.iter().collect();
    assert_eq!(
        counted(&client, &all, 1_000_000).await,
        (by_state(&answering, u64::MAX), vec![2]),
        "the answering shards' counts, naming the one that did not answer"
    );
    match client.find_execution("orders", "order-42").await.expect("find") {
        Resolution::Indeterminate {
            ended,
            unavailable_shards,
        } => {
            assert_eq!(ended.map(|e| e.execution_id), Some(old.execution_id));
            assert_eq!(
                unavailable_shards.keys().map(|s| s.get()).collect::<Vec<_>>(),
                vec![2]
            );
        }
        other => panic!("with the live run's shard down: {other:?}"),
    }
    assert!(matches!(
        client.find_execution("orders", "order-43").await.expect("find"),
        Resolution::Indeterminate { ended: None, .. }
    ));
    shards(&["start-one", "2"]);
    let back = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let page = client
                .list_executions(&all, None, 5, SortOrder::Desc)
                .await
                .expect("a page");
            if page.status == PageStatus::Complete {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "shard 2 did not come back within 30 s");
    let counts: BTreeMap<u16, usize> = truth.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.shard).or_default() += 1;
        m
    });
    eprintln!("done in {:?}; rows per shard {counts:?}", started.elapsed());
    shards(&["down"]);
}
