//! The operator's listing of held mutexes, three ways that must agree: the
//! SQL function on each shard (`sheaf.list_mutexes`), the driver's
//! fleet-wide page (`Admin::list_mutexes`, merged by key then shard, a
//! cursor per shard) and `sheaf --json mutexes list`. The test's keys
//! share a prefix no other test uses, so every listing is read from a
//! cursor placed just before them and the rest of the shared fleet does
//! not matter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sheaf_core::listing::{ShardCursor, listing_hash};
use sheaf_driver::{Acquired, Client, ListedMutex, MutexKey, PoolOptions, ShardId};
use sheaf_tests::{cli_json, connect, fleet, mutexes_from, unique};
use uuid::Uuid;

/// Long, so no waiter's place lapses (a third of it) during the test.
const LEASE: Duration = Duration::from_secs(600);

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

/// (shard, key, holder, token, waiters): what the three listings compare.
type Seen = (u16, String, String, i64, i32);

fn seen(m: &ListedMutex) -> Seen {
    (
        m.shard.get(),
        m.key.clone(),
        m.holder.to_string(),
        m.token,
        m.waiters,
    )
}

/// The test's mutexes through the driver, pages of `page_size` from the
/// prefix on, until a page ends past it; also how many pages it took.
async fn driver_listing(c: &Client, prefix: &str, page_size: usize) -> (Vec<Seen>, usize) {
    let mut out = Vec::new();
    let mut cursor = Some(mutexes_from(prefix));
    let mut pages = 0;
    while let Some(at) = cursor {
        let page = c
            .admin()
            .list_mutexes(Some(&at), page_size)
            .await
            .expect("a page of mutexes");
        assert!(page.unavailable_shards.is_empty(), "every shard answers");
        assert!(page.items.len() <= page_size);
        pages += 1;
        let past = page.items.iter().any(|m| !m.key.starts_with(prefix));
        out.extend(page.items.iter().filter(|m| m.key.starts_with(prefix)).map(seen));
        cursor = if past { None } else { page.next_cursor };
    }
    (out, pages)
}

/// The test's mutexes through SQL, shard by shard, in the driver's order.
async fn sql_listing(prefix: &str) -> Vec<Seen> {
    let mut out = Vec::new();
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let rows = db
            .query(
                "SELECT key, holder, token, waiters, acquired_at <= now() AND lease_expires_at > now() \
                 FROM sheaf.list_mutexes($1, 1000)",
                &[&prefix],
            )
            .await
            .expect("list_mutexes");
        for r in rows.iter().filter(|r| r.get::<_, String>(0).starts_with(prefix)) {
            assert!(r.get::<_, bool>(4), "acquired before now, its lease running");
            out.push((
                shard.id.get(),
                r.get(0),
                r.get::<_, Uuid>(1).to_string(),
                r.get(2),
                r.get(3),
            ));
        }
    }
    out.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
    out
}

/// The test's mutexes through `sheaf --json mutexes list`.
fn cli_listing(prefix: &str) -> Vec<Seen> {
    let (code, page) = cli_json(&[
        "mutexes",
        "list",
        "--cursor",
        &mutexes_from(prefix),
        "--page-size",
        "999",
    ]);
    assert_eq!(code, Some(0), "{page}");
    assert_eq!(page["status"], "complete", "{page}");
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|m| m["key"].as_str().is_some_and(|k| k.starts_with(prefix)))
        .map(|m| {
            (
                m["shard"].as_u64().expect("a shard") as u16,
                m["key"].as_str().expect("a key").to_owned(),
                m["holder"].as_str().expect("a holder").to_owned(),
                m["token"].as_i64().expect("a token"),
                m["waiters"].as_i64().expect("waiters") as i32,
            )
        })
        .collect()
}

async fn take(c: &Client, key: &MutexKey, owner: Uuid) -> Acquired {
    c.mutex_acquire(key, owner, LEASE).await.expect("mutex_acquire")
}

#[tokio::test]
async fn the_sql_the_driver_and_the_cli_list_the_same_held_mutexes() {
    let c = client();
    let prefix = unique("mxl");
    let shards: Vec<ShardId> = fleet().shards().map(|s| s.id).collect();
    let (a, b) = (shards[0], shards[shards.len() - 1]);
    // Keys on two shards, one key held on both (two locks), and a line of
    // waiters on some.
    let plan: Vec<(MutexKey, usize)> = vec![
        (MutexKey::on_shard(format!("{prefix}-a"), a), 2),
        (MutexKey::on_shard(format!("{prefix}-b"), b), 0),
        (MutexKey::on_shard(format!("{prefix}-c"), a), 1),
        (MutexKey::on_shard(format!("{prefix}-d"), b), 3),
        (MutexKey::on_shard(format!("{prefix}-e"), a), 0),
        (MutexKey::on_shard(format!("{prefix}-e"), b), 1),
    ];
    let mut expected = Vec::new();
    let mut held = Vec::new();
    for (key, waiters) in &plan {
        let holder = Uuid::new_v4();
        let Acquired::Granted { token } = take(&c, key, holder).await else {
            panic!("{} is free: the holder gets it", key.key());
        };
        let mut line = Vec::new();
        for place in 1..=*waiters {
            let w = Uuid::new_v4();
            assert_eq!(
                take(&c, key, w).await,
                Acquired::Queued {
                    position: place as i32
                }
            );
            line.push(w);
        }
        expected.push((
            c.mutex_shard(key).get(),
            key.key().to_owned(),
            holder.to_string(),
            token,
            *waiters as i32,
        ));
        held.push((key.clone(), holder, token, line));
    }
    expected.sort_by(|x, y| (&x.1, x.0).cmp(&(&y.1, y.0)));

    let sql = sql_listing(&prefix).await;
    assert_eq!(
        sql, expected,
        "the shards list every held key with its holder and line"
    );
    let (driver, pages) = driver_listing(&c, &prefix, 2).await;
    assert_eq!(driver, expected, "pages of two merge into the same list");
    assert!(pages >= 3, "six locks in pages of two: {pages} pages");
    assert_eq!(driver_listing(&c, &prefix, 999).await.0, expected);
    assert_eq!(cli_listing(&prefix), expected, "the CLI says the same");

    // A waiter that leaves is no longer counted; a released key whose
    // line is empty is free and no longer listed.
    let (key_d, gone) = (held[3].0.clone(), held[3].3.remove(0));
    c.mutex_leave(&key_d, gone).await.expect("leave");
    let (key_b, holder_b, token_b, _) = held.remove(1);
    assert_eq!(
        c.mutex_release(&key_b, holder_b, token_b).await.expect("release"),
        None
    );
    expected.retain(|m| m.1 != key_b.key());
    for m in expected.iter_mut().filter(|m| m.1 == key_d.key()) {
        m.4 = 2;
    }
    assert_eq!(sql_listing(&prefix).await, expected);
    assert_eq!(driver_listing(&c, &prefix, 2).await.0, expected);
    assert_eq!(cli_listing(&prefix), expected);

    // Leave nothing held behind.
    for (key, holder, token, line) in held {
        for w in line {
            c.mutex_leave(&key, w).await.expect("leave");
        }
        c.mutex_release(&key, holder, token).await.expect("release");
    }
    assert!(sql_listing(&prefix).await.is_empty(), "every key is free");
}

#[tokio::test]
async fn a_bad_page_size_or_cursor_is_the_callers_mistake() {
    let c = client();
    for (cursor, size) in [(None, 0), (None, 1000), (Some("s1.bogus"), 10)] {
        let e = c.admin().list_mutexes(cursor, size).await.expect_err("refused");
        assert!(
            matches!(e, sheaf_driver::ClientError::BadRequest(_)),
            "{cursor:?} {size}: {e:?}"
        );
    }
    let tasks_cursor = ShardCursor {
        anchors: BTreeMap::new(),
        listing: listing_hash(&["dead", ""]),
    }
    .encode();
    let e = c
        .admin()
        .list_mutexes(Some(&tasks_cursor), 10)
        .await
        .expect_err("another listing's cursor is refused");
    assert!(e.to_string().contains("another listing"), "{e}");
    // A mutexes cursor whose anchor is not a key.
    let not_a_key = ShardCursor {
        anchors: BTreeMap::from([(fleet().default_shard().get(), Value::from(5))]),
        listing: listing_hash(&["mutexes"]),
    }
    .encode();
    let e = c
        .admin()
        .list_mutexes(Some(&not_a_key), 10)
        .await
        .expect_err("an anchor that is not a key is refused");
    assert!(e.to_string().contains("listing of mutexes"), "{e}");
}
