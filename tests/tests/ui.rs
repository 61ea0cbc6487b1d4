//! The fleet dashboard in a real browser: headless Chromium (Debian's
//! `chromium` and `chromium-driver`, installed by `scripts/bootstrap`) driven
//! over WebDriver against a dashboard over the live shards. Every page
//! loads, its tables match what the client reads, and a screenshot of each
//! is saved under the test's output directory (`target/.../tmp/ui`).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use serde_json::json;
use sheaf_driver::{Client, EnqueueOptions, Placement, PoolOptions, UiOptions, UiServer};
use sheaf_tests::{fleet, unique};

/// A chromedriver on a free port, stopped with the test.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver runs (scripts/bootstrap installs chromium-driver)");
    Driver(child, port)
}

async fn browser(driver: &Driver) -> fantoccini::Client {
    // WebDriver runs over plain HTTP here; fantoccini's client still asks
    // for a TLS provider, and the build has two to choose from.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]}),
    );
    let url = format!("http://127.0.0.1:{}", driver.1);
    for _ in 0..50 {
        if let Ok(c) = ClientBuilder::rustls()
            .expect("rustls")
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("chromedriver did not start a session");
}

fn shots() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_and_queue_pages_show_what_the_client_reads() {
    let client = Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"));
    let queue = unique("ui-q");
    for shard in fleet().shards() {
        for n in 0..3 {
            client
                .enqueue(
                    &queue,
                    json!({ "n": n }),
                    EnqueueOptions::new().placement(Placement::Shard(shard.id)),
                )
                .await
                .expect("enqueue");
        }
    }
    let server = UiServer::start(
        client.clone(),
        "127.0.0.1:0".parse().expect("an address"),
        UiOptions::default(),
    )
    .await
    .expect("the dashboard starts");
    let base = format!("http://{}", server.local_addr());
    let driver = chromedriver();
    let b = browser(&driver).await;

    b.goto(&format!("{base}/")).await.expect("the fleet page");
    assert_eq!(b.title().await.expect("a title"), "sheaf · fleet");
    let rows = b
        .find_all(Locator::Css("#shards tr[data-shard]"))
        .await
        .expect("shard rows");
    assert_eq!(rows.len(), fleet().shards().count(), "a row per shard");
    let html = b.source().await.expect("the page source");
    assert!(!html.contains("postgres://"), "no connection string on a page");
    assert!(
        b.find(Locator::Css("#partial")).await.is_err(),
        "no partial banner: every shard is up"
    );
    std::fs::write(
        shots().join("fleet.png"),
        b.screenshot().await.expect("a screenshot"),
    )
    .expect("saved");

    b.goto(&format!("{base}/queues")).await.expect("the queues page");
    let total = b
        .find(Locator::Css(&format!(
            "tr[data-queue='{queue}'][data-shard='all'] td:nth-child(3)"
        )))
        .await
        .expect("the queue's total row")
        .text()
        .await
        .expect("its ready count");
    let listing = client.list_queues().await;
    let expected = listing
        .queues
        .iter()
        .find(|q| q.queue == queue)
        .expect("the queue is listed")
        .total
        .ready;
    assert_eq!(total, expected.to_string(), "the page's total is the client's");
    let per_shard = b
        .find_all(Locator::Css(&format!("tr[data-queue='{queue}']")))
        .await
        .expect("the queue's rows");
    assert_eq!(
        per_shard.len(),
        fleet().shards().count() + 1,
        "a row per shard and the total"
    );
    std::fs::write(
        shots().join("queues.png"),
        b.screenshot().await.expect("a screenshot"),
    )
    .expect("saved");

    b.close().await.expect("the browser closes");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_executions_page_filters_pages_across_shards_and_escapes() {
    let client = Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"));
    let name = unique("ui-wf");
    // 60 runs over every shard (the page holds 50), one with markup in its id.
    for n in 0..60 {
        let id = if n == 0 {
            "<script>window.pwned=1</script>".to_owned()
        } else {
            format!("run-{n}")
        };
        client
            .start_workflow(&name, &id, json!({ "n": n }), sheaf_driver::StartOptions::new())
            .await
            .expect("start");
    }
    let server = UiServer::start(
        client.clone(),
        "127.0.0.1:0".parse().expect("an address"),
        UiOptions::default(),
    )
    .await
    .expect("the dashboard starts");
    let base = format!("http://{}", server.local_addr());
    let driver = chromedriver();
    let b = browser(&driver).await;
    b.goto(&format!("{base}/executions?workflow={name}"))
        .await
        .expect("the executions page");
    let ids = |b: fantoccini::Client| async move {
        let mut out = Vec::new();
        for row in b
            .find_all(Locator::Css("#executions tr[data-execution]"))
            .await
            .expect("rows")
        {
            out.push(row.attr("data-execution").await.expect("an id").expect("an id"));
        }
        out
    };
    let first = ids(b.clone()).await;
    assert_eq!(first.len(), 50, "a full page");
    std::fs::write(
        shots().join("executions.png"),
        b.screenshot().await.expect("a screenshot"),
    )
    .expect("saved");
    b.find(Locator::Css("#next"))
        .await
        .expect("a next page")
        .click()
        .await
        .expect("go on");
    let second = ids(b.clone()).await;
    assert_eq!(second.len(), 10, "the rest");
    assert!(
        second.iter().all(|id| !first.contains(id)),
        "no run twice across pages"
    );
    let pwned = b
        .execute("return window.pwned === undefined", vec![])
        .await
        .expect("a script runs");
    assert_eq!(pwned, json!(true), "markup in a workflow id stays text");
    // The oldest run (on this last page) shows its id as the text it is.
    let shown = b
        .find(Locator::XPath(
            "//table[@id='executions']//td[contains(., 'window.pwned')]",
        ))
        .await
        .expect("the run with markup in its id")
        .text()
        .await
        .expect("its text");
    assert_eq!(shown, "<script>window.pwned=1</script>");
    b.goto(&format!("{base}/executions?workflow={name}&state=COMPLETED"))
        .await
        .expect("filtered");
    assert!(ids(b.clone()).await.is_empty(), "a filter narrows the list");
    b.close().await.expect("the browser closes");
    server.shutdown().await;
}
