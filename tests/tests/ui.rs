//! The fleet dashboard in a real browser: headless Chromium (Debian's
//! `chromium` and `chromium-driver`, installed by `scripts/bootstrap`) driven
//! over WebDriver against a dashboard over the live shards. Every page
//! loads without a console error, its lists match the CLI's JSON, filters
//! narrow, pages cross shards without duplicates, markup in user data stays
//! text, actions need the admin token and are audited with the session's
//! actor, and a stopped shard is named in the partial banner. A screenshot
//! of each page is saved under the test's output directory
//! (`target/.../tmp/ui`).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{ClientBuilder, Locator};
use serde_json::json;
use sheaf_driver::{
    ChildPlacement, Client, EnqueueOptions, ExecutionId, Placement, PoolOptions, ShardId, StartOptions,
    TaskId, Topology,
};
use sheaf_tests::{cli_json, cli_json_on, dead_letters, fleet, unique};
use sheaf_web::{UiOptions, UiServer};

/// A chromedriver on a free port, stopped with the test: its whole process
/// group, so a browser it started goes too when a test fails before
/// closing its session.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
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
        .process_group(0)
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
    caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
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

/// Chromedriver's console log (its `se/log` extension of WebDriver).
#[derive(Debug)]
struct BrowserLog;

impl fantoccini::wd::WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base: &url::Url, session: Option<&str>) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type": "browser"}"#.into()))
    }
}

/// The console's errors since the last call (the log is read once).
async fn console_errors(b: &fantoccini::Client) -> Vec<String> {
    let log = b.issue_cmd(BrowserLog).await.expect("the console log");
    log.as_array()
        .expect("a list of entries")
        .iter()
        .filter(|e| e["level"] == "SEVERE")
        .map(|e| e["message"].to_string())
        .collect()
}

/// Opens `path`, checks the console stayed clean, saves a screenshot as
/// `shot`.png.
async fn visit(b: &fantoccini::Client, base: &str, path: &str, shot: &str) {
    b.goto(&format!("{base}{path}")).await.expect("the page");
    let errors = console_errors(b).await;
    assert!(errors.is_empty(), "{path}: console errors {errors:?}");
    let html = b.source().await.expect("the page's source");
    assert!(
        !html.contains("postgres://") && !html.contains("password="),
        "{path}: no connection string"
    );
    assert!(
        b.find(Locator::Css("script")).await.is_err(),
        "{path}: no script element, whatever the data"
    );
    save(b, shot).await;
}

async fn save(b: &fantoccini::Client, shot: &str) {
    std::fs::write(
        shots().join(format!("{shot}.png")),
        b.screenshot().await.expect("a screenshot"),
    )
    .expect("saved");
}

/// A dashboard, a chromedriver and a browser session over it.
struct Dash {
    server: UiServer,
    base: String,
    b: fantoccini::Client,
    _driver: Driver,
}

impl Dash {
    async fn start(client: Arc<Client>, token: Option<&str>) -> Dash {
        let server = UiServer::start(
            client,
            "127.0.0.1:0".parse().expect("an address"),
            // The stories read payloads signed out too; the default
            // (hidden) is a_bad_query_is_a_400_naming_its_parameter's.
            UiOptions::default()
                .admin_token(token.map(str::to_owned))
                .sample_every(Duration::from_secs(1))
                .public_read(true)
                // A reload between two steps would lose a ticked box:
                // refresh_is_switched_off_and_on_per_browser reloads.
                .refresh_every(Duration::ZERO),
        )
        .await
        .expect("the dashboard starts");
        let base = format!("http://{}", server.local_addr());
        let driver = chromedriver();
        let b = browser(&driver).await;
        Dash {
            server,
            base,
            b,
            _driver: driver,
        }
    }

    async fn stop(self) {
        self.b.close().await.expect("the browser closes");
        self.server.shutdown().await;
    }

    /// The first element `css` matches, once there is one. Any error is
    /// asked again: a page still loading after a click answers "aborted
    /// by navigation" or a stale element.
    async fn element(&self, css: &str) -> fantoccini::elements::Element {
        let mut last = String::new();
        for _ in 0..200 {
            match self.b.find(Locator::Css(css)).await {
                Ok(e) => return e,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css}: {last}");
    }

    async fn text(&self, css: &str) -> String {
        for _ in 0..20 {
            if let Ok(text) = self.element(css).await.text().await {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css}: no text");
    }

    /// The values of `attr` of the elements `css` matches. A page that
    /// reloads itself (the refresh story) can go stale between finding
    /// the elements and reading them: then the whole page is read again.
    async fn attrs(&self, css: &str, attr: &str) -> Vec<String> {
        let mut last = String::new();
        'again: for _ in 0..200 {
            let found = match self.b.find_all(Locator::Css(css)).await {
                Ok(found) => found,
                Err(e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let mut out = Vec::new();
            for e in found {
                match e.attr(attr).await {
                    Ok(value) => out.push(value.expect("an attribute")),
                    Err(e) => {
                        last = e.to_string();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue 'again;
                    }
                }
            }
            return out;
        }
        panic!("{css}: {last}");
    }

    /// Follows the page's *Next page* link and waits until its page is the
    /// one shown (its address carries the cursor).
    async fn next_page(&self) {
        let before = self.b.current_url().await.expect("an address");
        self.click("#next").await;
        for _ in 0..100 {
            let Ok(now) = self.b.current_url().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if now != before && now.as_str().contains("cursor=") {
                self.element("main").await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the next page did not load");
    }

    /// Goes where the link `css` leads (a path of this dashboard).
    async fn follow(&self, css: &str) {
        let hrefs = self.attrs(css, "href").await;
        let [href] = hrefs.as_slice() else {
            panic!("{css}: {hrefs:?}");
        };
        assert!(href.starts_with('/'), "{css}: {href}");
        self.b
            .goto(&format!("{}{href}", self.base))
            .await
            .expect("the page");
    }

    /// Clicks `css`, waiting for it to be there (a click that navigated
    /// may still be loading the page it leads to). An element gone stale
    /// before the click (a page that reloads itself) was not clicked:
    /// it is found again.
    async fn click(&self, css: &str) {
        let mut last = String::new();
        for _ in 0..200 {
            match self.element(css).await.click().await {
                Ok(_) => return,
                Err(e) if e.is_stale_element_reference() => last = e.to_string(),
                Err(e) => panic!("{css}: a click: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css}: {last}");
    }
}

/// The `key` of each item of `sheaf --json ARGS`' page.
fn ids_from_cli(spec: &str, args: &[&str], key: &str) -> Vec<String> {
    let (code, out) = cli_json_on(spec, args);
    assert_eq!(code, Some(0), "{args:?}: {out}");
    out["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| e[key].as_str().expect("an id").to_owned())
        .collect()
}

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_page_loads_cleanly_and_its_lists_match_the_cli() {
    // Shards of its own: the near-cap list is the fleet's top 25, which
    // other tests' keys would crowd.
    let own = |args: &[&str]| sheaf_tests::own_shards("ui-all", 28500, args);
    let spec = own(&["up", "--count", "3", "--no-install"]);
    let topology = Topology::parse(&spec).expect("shards");
    let spec = spec.trim().replace('\n', ",");
    let c = Arc::new(Client::new(topology.clone(), PoolOptions::default()).expect("a client"));
    let queue = unique("ui-q");
    let shards: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    for shard in &shards {
        for n in 0..3 {
            c.enqueue(
                &queue,
                json!({ "n": n }),
                EnqueueOptions::new().placement(Placement::Shard(*shard)),
            )
            .await
            .expect("enqueue");
        }
        dead_letters(&c, &queue, *shard, 2, "boom").await;
    }
    let wf = unique("ui-all");
    let mut parent = None;
    for n in 0..7 {
        let started = c
            .start_workflow(
                &wf,
                &format!("r{n}"),
                json!({ "n": n }),
                StartOptions::new().search_attr("tenant", if n % 2 == 0 { "even" } else { "odd" }),
            )
            .await
            .expect("start");
        parent.get_or_insert(started);
    }
    let parent = parent.expect("a run");
    let child = c
        .start_child(
            parent.execution_id,
            &unique("ui-child"),
            "c-1",
            json!({}),
            ChildPlacement::Shard(parent.shard),
        )
        .await
        .expect("a child");
    // A key at its cap of 1 with two tasks waiting for the slot.
    let key = unique("ui-key");
    c.admin()
        .set_concurrency_limit(&key, Some(1))
        .await
        .into_result()
        .expect("a cap on every shard");
    for _ in 0..3 {
        c.enqueue(
            &queue,
            json!({}),
            EnqueueOptions::new()
                .concurrency_key(&key)
                .placement(Placement::Shard(shards[0])),
        )
        .await
        .expect("enqueue");
    }
    let d = Dash::start(c.clone(), Some("a-token-for-the-ui-tests")).await;

    // The checker sees an error when there is one: a missing page's 404.
    d.b.goto(&format!("{}/no-such-page", d.base))
        .await
        .expect("a 404");
    assert!(!console_errors(&d.b).await.is_empty(), "a 404 is a console error");

    visit(&d.b, &d.base, "/", "fleet").await;
    assert_eq!(
        d.attrs("#shards tr[data-shard]", "data-shard").await.len(),
        shards.len()
    );
    assert!(
        !d.b.source().await.expect("source").contains("postgres://"),
        "no connection string"
    );
    assert!(
        d.b.find(Locator::Css("#partial")).await.is_err(),
        "every shard answered"
    );

    // Queues: each shard's counts and the total are the CLI's.
    // The depth and throughput charts need two samples (one a second here);
    // a loaded machine may take longer to read them.
    let charted = format!("tr[data-queue='{queue}'] svg.chart polyline");
    for _ in 0..60 {
        d.b.goto(&format!("{}/queues", d.base))
            .await
            .expect("the queues page");
        if d.b.find(Locator::Css(&charted)).await.is_ok()
            && d.b
                .find(Locator::Css("svg.chart polyline[stroke='#8250df']"))
                .await
                .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    visit(&d.b, &d.base, "/queues", "queues").await;
    let (code, cli) = cli_json_on(&spec, &["queues"]);
    assert_eq!(code, Some(0), "{cli}");
    let listed = cli["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue"] == queue.as_str())
        .expect("the CLI lists the queue")
        .clone();
    for (shard, counts) in listed["per_shard"].as_object().expect("per shard") {
        // Counted from the row's end: the first row also holds the queue's
        // name and chart.
        for (from_end, field) in [(7, "ready"), (2, "dead")] {
            let cell = d
                .text(&format!(
                    "tr[data-queue='{queue}'][data-shard='{shard}'] td:nth-last-child({from_end})"
                ))
                .await;
            assert_eq!(cell, counts[field].to_string(), "shard {shard} {field}");
        }
    }
    let total_ready = d
        .text(&format!(
            "tr[data-queue='{queue}'][data-shard='all'] td:nth-last-child(7)"
        ))
        .await;
    assert_eq!(total_ready, listed["total"]["ready"].to_string());
    let cell = |n: u32| format!("#near-cap tr[data-key='{key}'] td:nth-child({n})");
    assert_eq!(d.text(&cell(3)).await, "1", "its cap");
    assert_eq!(d.text(&cell(6)).await, "2", "waiting for its slot");
    assert!(
        d.b.find(Locator::Css(&charted)).await.is_ok(),
        "the queue's depth is charted"
    );
    assert!(
        d.text("#throughput").await.starts_with("Tasks finished"),
        "the fleet's throughput"
    );

    // Executions: the page's rows are the CLI's first page, in order.
    visit(&d.b, &d.base, &format!("/executions?workflow={wf}"), "executions").await;
    let cli_ids = ids_from_cli(
        &spec,
        &["list", "--workflow", &wf, "--page-size", "50"],
        "execution_id",
    );
    assert_eq!(
        d.attrs("#executions tr[data-execution]", "data-execution").await,
        cli_ids
    );
    // An attribute filter narrows it.
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={wf}&attr=tenant%3Dodd"),
        "executions-filtered",
    )
    .await;
    assert_eq!(
        d.attrs("#executions tr[data-execution]", "data-execution")
            .await
            .len(),
        3
    );
    // A bad filter is refused naming the field, and the page still loads.
    d.b.goto(&format!("{}/executions?after=someday", d.base))
        .await
        .expect("refused");
    assert!(d.text("#error").await.starts_with("after:"));
    // Its 400 is a console error of its own; the next pages must have none.
    assert_eq!(console_errors(&d.b).await.len(), 1);

    // An execution's page: where it lives, its history, its child.
    visit(
        &d.b,
        &d.base,
        &format!("/executions/{}", parent.execution_id),
        "execution",
    )
    .await;
    assert_eq!(d.text("#lives").await, format!("shard {}", parent.shard));
    assert!(d.text("#history").await.contains("WorkflowStarted"));
    assert_eq!(
        d.attrs("#children tr[data-child]", "data-child").await,
        [child.child_id.to_string()]
    );
    d.b.goto(&format!("{}/executions/not-an-id", d.base))
        .await
        .expect("refused");
    assert_eq!(d.text("#error").await, "not an execution id");
    assert_eq!(console_errors(&d.b).await.len(), 1, "its 400");

    // Dead letters: the page's rows are the CLI's.
    visit(
        &d.b,
        &d.base,
        &format!("/dead-letters?queue={queue}"),
        "dead-letters",
    )
    .await;
    let cli_ids = ids_from_cli(&spec, &["dead-letters", "list", "--queue", &queue], "task_id");
    assert_eq!(cli_ids.len(), 2 * shards.len());
    assert_eq!(d.attrs("#dead-letters tr[data-task]", "data-task").await, cli_ids);

    // Tasks: the queue's unfinished tasks are the CLI's.
    visit(&d.b, &d.base, &format!("/tasks?queue={queue}"), "tasks").await;
    let cli_ids = ids_from_cli(&spec, &["tasks", "list", &queue, "--page-size", "50"], "task_id");
    assert_eq!(cli_ids.len(), 3 * shards.len() + 3);
    assert_eq!(d.attrs("#tasks tr[data-task]", "data-task").await, cli_ids);

    // Usage: the runs started above are counted under their workflow.
    visit(&d.b, &d.base, "/usage?window=1h", "usage").await;
    let row = d
        .text(&format!("#usage tr[data-group='{wf}'] td:nth-child(2)"))
        .await;
    assert_eq!(row, "7");

    // Mutexes: a held key with a waiter; the page's keys are the CLI's.
    let lock = sheaf_driver::MutexKey::on_shard(unique("ui-all-lock"), shards[0]);
    for _ in 0..2 {
        c.mutex_acquire(&lock, uuid::Uuid::new_v4(), Duration::from_secs(600))
            .await
            .expect("held, then queued");
    }
    visit(&d.b, &d.base, "/mutexes", "mutexes-all").await;
    let cli_keys = ids_from_cli(&spec, &["mutexes", "list"], "key");
    assert!(cli_keys.contains(&lock.key().to_owned()), "{cli_keys:?}");
    assert_eq!(d.attrs("#mutexes tr[data-key]", "data-key").await, cli_keys);
    visit(&d.b, &d.base, "/rebalance", "rebalance").await;
    visit(&d.b, &d.base, "/login", "login").await;
    visit(&d.b, &d.base, "/tasks", "tasks-choose").await;
    d.stop().await;
    own(&["down"]);
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_executions_page_pages_across_shards_and_keeps_markup_inert() {
    let c = client();
    let name = unique("ui-wf");
    // 60 runs over every shard (the page holds 50), one with markup in its
    // id and its input.
    for n in 0..60 {
        let id = match n {
            0 => "<script>window.pwned=1</script>".to_owned(),
            1 => r#"run" data-x="1' & <b>bold</b>"#.to_owned(),
            _ => format!("run-{n}"),
        };
        c.start_workflow(
            &name,
            &id,
            json!({ "n": n, "html": "<img src=x onerror=window.pwned=2>" }),
            StartOptions::new(),
        )
        .await
        .expect("start");
    }
    let d = Dash::start(c.clone(), None).await;
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={name}"),
        "executions-page-1",
    )
    .await;
    let first = d.attrs("#executions tr[data-execution]", "data-execution").await;
    assert_eq!(first.len(), 50, "a full page");
    d.next_page().await;
    let second = d.attrs("#executions tr[data-execution]", "data-execution").await;
    assert_eq!(second.len(), 10, "the rest");
    assert!(
        second.iter().all(|id| !first.contains(id)),
        "no run twice across pages"
    );
    let mut all: Vec<&String> = first.iter().chain(&second).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 60, "every run once");
    let runs_on: std::collections::BTreeSet<String> = {
        let mut s = std::collections::BTreeSet::new();
        for id in first.iter().chain(&second) {
            let id: ExecutionId = id.parse().expect("an id");
            s.insert(id.shard().expect("a shard").to_string());
        }
        s
    };
    assert!(runs_on.len() > 1, "the pages merged several shards: {runs_on:?}");
    let untouched =
        d.b.execute("return window.pwned === undefined", vec![])
            .await
            .expect("a script runs");
    assert_eq!(untouched, json!(true), "markup in a workflow id stays text");
    let shown =
        d.b.find(Locator::XPath(
            "//table[@id='executions']//td[contains(., 'window.pwned')]",
        ))
        .await
        .expect("the run with markup in its id")
        .text()
        .await
        .expect("its text");
    assert_eq!(shown, "<script>window.pwned=1</script>");
    save(&d.b, "executions-page-2").await;
    // Its own page shows its input as text too.
    let pwned_id =
        d.b.find(Locator::XPath(
            "//table[@id='executions']//tr[td[contains(., 'window.pwned')]]",
        ))
        .await
        .expect("its row")
        .attr("data-execution")
        .await
        .expect("an id")
        .expect("an id");
    visit(
        &d.b,
        &d.base,
        &format!("/executions/{pwned_id}"),
        "execution-markup",
    )
    .await;
    assert!(
        d.text("#input")
            .await
            .contains("<img src=x onerror=window.pwned=2>")
    );
    assert!(
        d.b.find(Locator::Css("main img")).await.is_err(),
        "no element made of a payload"
    );
    let untouched =
        d.b.execute("return window.pwned === undefined", vec![])
            .await
            .expect("a script runs");
    assert_eq!(untouched, json!(true));
    d.b.goto(&format!("{}/executions?workflow={name}&state=COMPLETED", d.base))
        .await
        .expect("filtered");
    assert!(
        d.attrs("#executions tr[data-execution]", "data-execution")
            .await
            .is_empty(),
        "a filter narrows the list"
    );
    // Quotes in an id stay inside their attribute and cell (the run is on
    // the second page: among the oldest).
    d.b.goto(&format!("{}/executions?workflow={name}", d.base))
        .await
        .expect("the list");
    d.next_page().await;
    let quoted =
        d.b.find(Locator::XPath(
            "//table[@id='executions']//td[contains(., 'data-x')]",
        ))
        .await
        .expect("the run with quotes in its id")
        .text()
        .await
        .expect("its text");
    assert_eq!(quoted, r#"run" data-x="1' & <b>bold</b>"#);
    assert!(
        d.b.find(Locator::Css("[data-x], main b")).await.is_err(),
        "no attribute or element made of it"
    );
    // A window given as an age pages on: the next page's link carries the
    // instant it stood for.
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={name}&after=1h"),
        "executions-age",
    )
    .await;
    assert_eq!(
        d.attrs("#executions tr[data-execution]", "data-execution")
            .await
            .len(),
        50
    );
    d.next_page().await;
    assert!(
        d.b.find(Locator::Css("#error")).await.is_err(),
        "the cursor is this filter's"
    );
    assert_eq!(
        d.attrs("#executions tr[data-execution]", "data-execution")
            .await
            .len(),
        10
    );
    d.stop().await;
}

const TOKEN: &str = "a-token-for-the-ui-tests";

/// Signs in as `name` with `token`; whether it took.
async fn sign_in(d: &Dash, name: &str, token: &str) -> bool {
    // A wrong sign-in just before from this source makes it wait a moment
    // (the per-source backoff): that refusal says so, and the sign-in is
    // tried again once the wait is over, however fast the machine.
    for _ in 0..20 {
        d.b.goto(&format!("{}/login", d.base))
            .await
            .expect("the sign-in page");
        d.b.find(Locator::Css("input[name=name]"))
            .await
            .expect("a name")
            .send_keys(name)
            .await
            .expect("typed");
        d.b.find(Locator::Css("input[name=token]"))
            .await
            .expect("a token")
            .send_keys(token)
            .await
            .expect("typed");
        d.click("#login button").await;
        // Signed in (the fleet page, with the actor) or refused (the error).
        d.element("#actor, #error").await;
        if d.b.find(Locator::Css("#actor")).await.is_ok() {
            return true;
        }
        if !d.text("#error").await.contains("try again in") {
            return false;
        }
        let _ = console_errors(&d.b).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{name}: still told to wait after 20 tries");
}

/// Ticks `ids` on the dead-letter page of `queue` and asks to redrive them.
async fn ask_redrive(d: &Dash, queue: &str, ids: &[TaskId]) {
    d.b.goto(&format!("{}/dead-letters?queue={queue}", d.base))
        .await
        .expect("the page");
    for id in ids {
        d.click(&format!("input[type=checkbox][value='{id}']")).await;
    }
    d.click("#redrive-selected").await;
    d.element("#confirm").await;
}

async fn dead_now(c: &Client, queue: &str) -> Vec<TaskId> {
    c.admin()
        .list_dead_letters(Some(queue), None, 100)
        .await
        .expect("dead letters")
        .items
        .iter()
        .map(|d| d.task_id)
        .collect()
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn actions_need_the_token_a_confirmation_and_are_audited() {
    let c = client();
    let queue = unique("ui-act");
    let shard = fleet().shards().next().expect("a shard").id;
    let ids = dead_letters(&c, &queue, shard, 4, "<script>window.pwned=1</script> failed").await;
    let d = Dash::start(c.clone(), Some(TOKEN)).await;

    // Signed out: the confirmation warns, and the shards are not asked.
    ask_redrive(&d, &queue, &ids[..1]).await;
    assert!(d.b.find(Locator::Css("#signed-out")).await.is_ok());
    save(&d.b, "confirm-signed-out").await;
    d.click("#do-it").await;
    assert!(
        d.text("#refused").await.contains("sign in"),
        "refused without a session"
    );
    save(&d.b, "refused").await;
    assert_eq!(dead_now(&c, &queue).await.len(), 4, "nothing was redriven");
    let logged = console_errors(&d.b).await;
    assert!(
        logged.iter().all(|e| e.contains("403")),
        "only the refusal: {logged:?}"
    );
    // An error with markup is shown as the text it is.
    visit(
        &d.b,
        &d.base,
        &format!("/dead-letters?queue={queue}"),
        "dead-letters-markup",
    )
    .await;
    let shown = d
        .text(&format!("tr[data-task='{}'] td:nth-child(8) code", ids[0]))
        .await;
    assert_eq!(shown, "<script>window.pwned=1</script> failed");
    // A page asked for under another host name (a DNS rebinding) is refused.
    let host = d.base.trim_start_matches("http://");
    let rebound = raw(
        host,
        "GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");
    let own = raw(
        host,
        &format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(own.starts_with("HTTP/1.1 200"), "{own}");

    // A wrong token does not sign in.
    assert!(!sign_in(&d, "mallory", "not-the-token").await);
    assert!(d.text("#error").await.contains("not the admin token"));

    // Signed in: the redrive is done and audited with the session's actor.
    assert!(sign_in(&d, "tester", TOKEN).await);
    ask_redrive(&d, &queue, &ids[..2]).await;
    save(&d.b, "confirm").await;
    d.click("#do-it").await;
    let done = d.text(".result").await;
    assert!(done.starts_with("2 of 2 dead letter(s) redriven"), "{done}");
    save(&d.b, "redriven").await;
    let left = dead_now(&c, &queue).await;
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&ids[0]) && !left.contains(&ids[1]));
    let audit = c.admin().audit_log(shard, None, 50).await.expect("the audit log");
    assert!(
        audit
            .iter()
            .any(|e| e.action == "redrive" && e.actor == "ui:tester"),
        "the redrive is audited as ui:tester: {audit:?}"
    );

    // A forged POST with the session cookie but without its CSRF token is
    // refused; so is one from another origin.
    let (cookie, csrf) = session_of(&d).await;
    let forged = post(
        &d.base,
        "/act/purge",
        &format!("queue={queue}&csrf=guess"),
        &cookie,
        None,
    )
    .await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    let cross = post(
        &d.base,
        "/act/purge",
        &format!("queue={queue}&csrf={csrf}"),
        &cookie,
        Some("http://evil.example"),
    )
    .await;
    assert!(cross.starts_with("HTTP/1.1 403"), "{cross}");
    assert_eq!(dead_now(&c, &queue).await.len(), 2, "nothing was purged");

    // Purge, with its confirmation.
    d.b.goto(&format!("{}/dead-letters?queue={queue}", d.base))
        .await
        .expect("the page");
    d.click("#purge button").await;
    assert!(d.text("#what").await.contains("cannot be undone"));
    d.click("#do-it").await;
    assert!(d.text(".result").await.starts_with("2 dead letter(s)"));
    assert!(dead_now(&c, &queue).await.is_empty());

    // Cancel a task from the tasks page.
    let task = c
        .enqueue(
            &queue,
            json!({}),
            EnqueueOptions::new().placement(Placement::Shard(shard)),
        )
        .await
        .expect("enqueue")
        .task_id;
    d.b.goto(&format!("{}/tasks?queue={queue}", d.base))
        .await
        .expect("the tasks page");
    d.click(&format!("tr[data-task='{task}'] button")).await;
    d.click("#do-it").await;
    assert_eq!(d.text(".result").await, format!("Task {task} cancelled."));
    assert!(
        c.admin()
            .audit_log(shard, None, 50)
            .await
            .expect("the audit log")
            .iter()
            .any(|e| e.action == "cancel_task" && e.actor == "ui:tester")
    );
    // Signing out ends the session: the next action is refused.
    d.click("form[action='/logout'] button").await;
    d.element("#signin").await;
    let after = post(
        &d.base,
        "/act/purge",
        &format!("queue={queue}&csrf={csrf}"),
        &cookie,
        None,
    )
    .await;
    assert!(after.starts_with("HTTP/1.1 403"), "{after}");
    d.stop().await;
}

/// A POST from outside the browser: its status line and the rest.
async fn post(base: &str, path: &str, body: &str, session: &str, origin: Option<&str>) -> String {
    let host = base.trim_start_matches("http://");
    let origin = origin.map_or_else(|| base.to_owned(), str::to_owned);
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nCookie: sheaf_ui={session}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    raw(host, &request).await
}

/// `request` sent as it is to `host`: the whole answer.
async fn raw(host: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("sent");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_shard_is_named_in_the_partial_banner() {
    let own = |args: &[&str]| sheaf_tests::own_shards("ui", 24700, args);
    let topology = Topology::parse(&own(&["up", "--count", "2", "--no-install"])).expect("shards");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2));
    let c = Arc::new(Client::new(topology.clone(), options).expect("a client"));
    let wf = unique("ui-down");
    for n in 0..10 {
        // Five on each shard, so both hold some.
        let on = ShardId::new(n % 2).expect("a shard id");
        c.start_workflow(
            &wf,
            &format!("r{n}"),
            json!({}),
            StartOptions::new().placement(Placement::Shard(on)),
        )
        .await
        .expect("start");
    }
    own(&["stop-one", "1"]);
    let d = Dash::start(c.clone(), None).await;
    for (path, shot) in [
        ("/".to_owned(), "partial-fleet"),
        (format!("/executions?workflow={wf}"), "partial-executions"),
        ("/queues".to_owned(), "partial-queues"),
        ("/dead-letters".to_owned(), "partial-dead-letters"),
    ] {
        d.b.goto(&format!("{}{path}", d.base)).await.expect("the page");
        let banner = d.text("#partial").await;
        assert!(
            banner.contains("shard 1") && !banner.contains("shard 0"),
            "{path}: {banner}"
        );
        save(&d.b, shot).await;
        if shot == "partial-fleet" {
            let readiness = d.text("tr[data-shard='1'] td.readiness").await;
            assert!(readiness.starts_with("unreachable"), "{readiness}");
            // Up, but held back for what it is: no worker serves it.
            let up = d.text("tr[data-shard='0'] td.readiness").await;
            assert!(
                up.starts_with("no_live_worker") && !up.contains("unreachable"),
                "{up}"
            );
        }
        if shot == "partial-executions" {
            let shown = d.attrs("#executions tr[data-execution]", "data-execution").await;
            assert_eq!(shown.len(), 5, "shard 0's runs, and only them");
        }
    }
    d.stop().await;
    own(&["up", "--count", "2", "--no-install"]);
}

/// `GET path` from outside the browser: its status line and the rest.
async fn get(base: &str, path: &str) -> String {
    let host = base.trim_start_matches("http://");
    raw(
        host,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// A sign-in POSTed from the local address `from`: the whole answer.
async fn sign_in_from(base: &str, from: &str, token: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let body = format!("name=tester&token={token}");
    let request = format!(
        "POST /login HTTP/1.1\r\nHost: {host}\r\nOrigin: {base}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(format!("{from}:0").parse().expect("an address"))
        .expect("bound");
    let mut s = socket
        .connect(host.parse().expect("an address"))
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("sent");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// A dashboard with an admin token and payloads hidden signed out (the
/// default), and its base address.
async fn signed_out_dashboard(c: Arc<Client>) -> (UiServer, String) {
    let server = UiServer::start(
        c,
        "127.0.0.1:0".parse().expect("an address"),
        UiOptions::default().admin_token(Some(TOKEN.to_owned())),
    )
    .await
    .expect("the dashboard starts");
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_query_is_a_400_naming_its_parameter() {
    let c = client();
    let (server, base) = signed_out_dashboard(c.clone()).await;
    let id = c
        .start_workflow(&unique("ui-bad"), "r", json!({}), StartOptions::new())
        .await
        .expect("start")
        .execution_id;
    for (path, param) in [
        // An age reaching before 1970 (it once reset the connection).
        ("/executions?after=100y", "after"),
        ("/executions?before=100y", "before"),
        ("/executions?after=soon", "after"),
        ("/executions?state=NOPE", "state"),
        ("/executions?attr=nokey", "attr"),
        ("/executions?cursor=v1.bogus", "cursor"),
        // A NUL the shards refuse is not a shard that did not answer.
        ("/executions?workflow=%00", "workflow"),
        ("/tasks?queue=%00", "queue"),
        ("/tasks?queue=q&state=NOPE", "state"),
        ("/tasks?queue=q&cursor=bogus", "cursor"),
        ("/dead-letters?queue=a%00b", "queue"),
        ("/dead-letters?cursor=bogus", "cursor"),
        ("/usage?window=1y", "window"),
        ("/confirm?action=drop", "action"),
        ("/confirm?action=redrive&task=nope", "task"),
    ] {
        let answer = get(&base, path).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        assert!(
            body.contains(&format!("{param}:")) || body.contains(&format!("\"{param}\":")),
            "{path} names {param}: {body}"
        );
        assert!(!body.contains("did not answer"), "{path} blames no shard: {body}");
    }
    let answer = get(&base, &format!("/executions/{id}?after=x")).await;
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("after:"),
        "{answer}"
    );
    assert!(
        get(&base, "/executions?after=2h")
            .await
            .starts_with("HTTP/1.1 200")
    );

    // The rebalance page names the command that exists.
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operating/cli-reference.md"
    ))
    .expect("the CLI reference");
    let page = get(&base, "/rebalance").await;
    let named = page
        .split("<code>sheaf ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the page names a command");
    assert!(
        reference.contains(&format!("## `sheaf {named}`")),
        "no `sheaf {named}` in the CLI reference"
    );

    // Wrong sign-ins from one address do not hold back one from another.
    let wrong = sign_in_from(&base, "127.0.0.1", "guess").await;
    assert!(wrong.starts_with("HTTP/1.1 403"), "{wrong}");
    let right = sign_in_from(&base, "127.0.0.2", TOKEN).await;
    assert!(
        right.starts_with("HTTP/1.1 303") && right.contains("sheaf_ui="),
        "{right}"
    );
    server.shutdown().await;
}

/// `GET path` by a session signed in from the local address `from`.
async fn signed_in_get(base: &str, from: &str, path: &str) -> String {
    let signed = sign_in_from(base, from, TOKEN).await;
    let cookie = signed
        .split("sheaf_ui=")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("a session cookie");
    let host = base.trim_start_matches("http://");
    raw(
        host,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: sheaf_ui={cookie}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payloads_need_a_session_unless_read_is_public() {
    let c = client();
    let secret = unique("a-secret-input");
    let id = c
        .start_workflow(
            &unique("ui-read"),
            "r",
            json!({ "s": secret }),
            StartOptions::new(),
        )
        .await
        .expect("start")
        .execution_id;
    let path = format!("/executions/{id}");
    let start = |public: bool| {
        UiServer::start(
            c.clone(),
            "127.0.0.1:0".parse().expect("an address"),
            UiOptions::default()
                .admin_token(Some(TOKEN.to_owned()))
                .public_read(public),
        )
    };
    let server = start(false).await.expect("the dashboard starts");
    let base = format!("http://{}", server.local_addr());
    let anonymous = get(&base, &path).await;
    assert!(anonymous.starts_with("HTTP/1.1 200"), "{anonymous}");
    assert!(!anonymous.contains(&secret), "the input is hidden");
    assert!(anonymous.contains("payloads-hidden") && anonymous.contains("RUNNING"));
    let probe = get(&base, "/executions?attr=tenant%3Dacme").await;
    assert!(
        probe.starts_with("HTTP/1.1 403") && probe.contains("attr:"),
        "{probe}"
    );
    let grouped = get(&base, "/usage?attr=tenant").await;
    assert!(
        grouped.starts_with("HTTP/1.1 403") && grouped.contains("attr:"),
        "{grouped}"
    );

    let read = signed_in_get(&base, "127.0.0.3", &path).await;
    assert!(
        read.starts_with("HTTP/1.1 200") && read.contains(&secret),
        "{read}"
    );
    server.shutdown().await;

    let public = start(true).await.expect("the dashboard starts");
    let base = format!("http://{}", public.local_addr());
    assert!(get(&base, &path).await.contains(&secret), "--public-read");
    public.shutdown().await;
}

// ---- Execution actions, auto-refresh, chart axes (issue 38, helper "act").

/// Types `text` into the first element `css` matches.
async fn type_into(d: &Dash, css: &str, text: &str) {
    d.element(css).await.send_keys(text).await.expect("typed");
}

/// Opens execution `id`'s page and asks for the action of its form `form`
/// (`#act-pause`, …) after `fill` typed into it; waits for the confirmation.
async fn ask_on_run(d: &Dash, id: ExecutionId, form: &str, fill: &[(&str, &str)]) {
    d.b.goto(&format!("{}/executions/{id}", d.base))
        .await
        .expect("the execution's page");
    for (field, text) in fill {
        type_into(d, &format!("{form} [name={field}]"), text).await;
    }
    d.click(&format!("{form} button")).await;
    d.element("#confirm, #error").await;
}

/// Whether shard `shard`'s audit log has `action` on `id` by `actor`.
async fn audited(c: &Client, shard: ShardId, action: &str, id: ExecutionId, actor: &str) -> bool {
    let target = id.to_string();
    c.admin()
        .audit_log(shard, None, 200)
        .await
        .expect("the audit log")
        .iter()
        .any(|e| e.action == action && e.actor == actor && e.target.as_deref() == Some(target.as_str()))
}

/// The signed-in browser's session cookie and CSRF token, for a POST
/// from outside it.
async fn session_of(d: &Dash) -> (String, String) {
    let cookie =
        d.b.get_named_cookie("sheaf_ui")
            .await
            .expect("the session cookie");
    let csrf = d
        .attrs("form[action='/logout'] input[name=csrf]", "value")
        .await
        .remove(0);
    (cookie.value().to_owned(), csrf)
}

async fn state_of(c: &Client, id: ExecutionId) -> &'static str {
    c.get_execution(id)
        .await
        .expect("a read")
        .expect("the execution")
        .state
        .as_str()
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn execution_actions_are_confirmed_audited_and_offered_by_state() {
    let c = client();
    let name = unique("ui-run");
    let start = |wid: &'static str| {
        let c = c.clone();
        let name = name.clone();
        async move {
            c.start_workflow(&name, wid, json!({}), StartOptions::new())
                .await
                .expect("start")
        }
    };
    let run = start("a").await;
    let (id, shard) = (run.execution_id, run.shard);
    let d = Dash::start(c.clone(), Some(TOKEN)).await;

    // Signed out: the confirmation warns, and the run is not signalled.
    ask_on_run(&d, id, "#act-signal", &[("signal", "go")]).await;
    assert!(d.b.find(Locator::Css("#signed-out")).await.is_ok());
    d.click("#do-it").await;
    assert!(d.text("#refused").await.contains("sign in"));
    let _ = console_errors(&d.b).await;
    let signalled = |c: Arc<Client>| async move {
        c.history(id, 0, 100)
            .await
            .expect("the history")
            .events
            .iter()
            .filter(|e| e.event_type == "SignalReceived")
            .count()
    };
    assert_eq!(signalled(c.clone()).await, 0, "nothing was delivered");

    assert!(sign_in(&d, "operator", TOKEN).await);
    // A running run offers cancel, terminate, signal and pause, not resume.
    visit(&d.b, &d.base, &format!("/executions/{id}"), "execution-actions").await;
    for form in ["#act-cancel", "#act-terminate", "#act-signal", "#act-pause"] {
        assert!(d.b.find(Locator::Css(form)).await.is_ok(), "{form} offered");
    }
    assert!(d.b.find(Locator::Css("#act-resume")).await.is_err());

    // A payload that is not JSON is refused on the confirmation, naming it.
    ask_on_run(&d, id, "#act-signal", &[("signal", "go"), ("payload", "{nope")]).await;
    assert!(d.text("#error").await.starts_with("payload: not JSON"));
    assert!(d.b.find(Locator::Css("#do-it")).await.is_err());
    let _ = console_errors(&d.b).await;

    // Signal, with its payload shown as text on the confirmation.
    ask_on_run(
        &d,
        id,
        "#act-signal",
        &[("signal", "go"), ("payload", r#"{"why": "<b>now</b>"}"#)],
    )
    .await;
    assert!(d.text("#what").await.contains(r#"{"why": "<b>now</b>"}"#));
    save(&d.b, "confirm-signal").await;
    d.click("#do-it").await;
    assert_eq!(
        d.text(".result").await,
        format!("Signal \"go\" delivered to execution {id}.")
    );
    assert_eq!(d.attrs("#back", "href").await, [format!("/executions/{id}")]);
    assert_eq!(signalled(c.clone()).await, 1);
    assert!(audited(&c, shard, "signal", id, "ui:operator").await);

    // Pause, then resume: each offered only in the state that allows it.
    ask_on_run(&d, id, "#act-pause", &[]).await;
    d.click("#do-it").await;
    assert_eq!(d.text(".result").await, format!("Execution {id} paused."));
    assert_eq!(state_of(&c, id).await, "PAUSED");
    assert!(audited(&c, shard, "pause_execution", id, "ui:operator").await);
    d.click("#back").await;
    d.element("#act-resume").await;
    assert!(d.b.find(Locator::Css("#act-pause")).await.is_err());
    ask_on_run(&d, id, "#act-resume", &[]).await;
    d.click("#do-it").await;
    assert_eq!(d.text(".result").await, format!("Execution {id} resumed."));
    assert_eq!(state_of(&c, id).await, "RUNNING");
    assert!(audited(&c, shard, "resume_execution", id, "ui:operator").await);

    // A pause confirmed now but done after the run ended says so plainly.
    ask_on_run(&d, id, "#act-pause", &[]).await;
    assert!(c.cancel_execution(id, Some("meanwhile")).await.expect("cancel"));
    d.click("#do-it").await;
    let stale = d.text("#stale").await;
    assert!(
        stale.contains("no longer applies") && stale.contains("CANCELLED"),
        "{stale}"
    );
    save(&d.b, "stale").await;
    let _ = console_errors(&d.b).await;
    // An ended run offers nothing.
    d.click("#back").await;
    assert!(d.text("#no-actions").await.contains("CANCELLED"));

    // Cancel and terminate, each with its reason.
    let second = start("b").await.execution_id;
    ask_on_run(&d, second, "#act-cancel", &[("reason", "not needed")]).await;
    assert!(d.text("#what").await.contains("not needed"));
    d.click("#do-it").await;
    assert_eq!(d.text(".result").await, format!("Execution {second} cancelled."));
    assert_eq!(state_of(&c, second).await, "CANCELLED");
    let second_shard = c.get_execution(second).await.expect("a read").expect("it").shard;
    assert!(audited(&c, second_shard, "cancel_execution", second, "ui:operator").await);
    let third = start("c").await;
    ask_on_run(&d, third.execution_id, "#act-terminate", &[("reason", "stuck")]).await;
    d.click("#do-it").await;
    assert_eq!(
        d.text(".result").await,
        format!("Execution {} terminated.", third.execution_id)
    );
    assert_eq!(state_of(&c, third.execution_id).await, "TERMINATED");
    assert!(
        audited(
            &c,
            third.shard,
            "terminate_execution",
            third.execution_id,
            "ui:operator"
        )
        .await
    );

    // Forged: the session's cookie without its CSRF token; a bad payload
    // with it. Neither reaches the run.
    let fourth = start("d").await.execution_id;
    let (cookie, csrf) = session_of(&d).await;
    let as_session = |path: &'static str, body: String| {
        let (base, cookie) = (d.base.clone(), cookie.clone());
        async move { post(&base, path, &body, &cookie, None).await }
    };
    let forged = as_session("/act/pause-execution", format!("execution={fourth}&csrf=guess")).await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    let bad = as_session(
        "/act/signal-execution",
        format!("execution={fourth}&signal=go&payload=%7Bnope&csrf={csrf}"),
    )
    .await;
    assert!(
        bad.starts_with("HTTP/1.1 400") && bad.contains("payload: not JSON"),
        "{bad}"
    );
    assert_eq!(state_of(&c, fourth).await, "RUNNING");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refresh_is_switched_off_and_on_per_browser() {
    let c = client();
    let id = c
        .start_workflow(&unique("ui-refresh"), "r", json!({}), StartOptions::new())
        .await
        .expect("start")
        .execution_id;
    let server = UiServer::start(
        c.clone(),
        "127.0.0.1:0".parse().expect("an address"),
        UiOptions::default()
            .admin_token(Some(TOKEN.to_owned()))
            .refresh_every(Duration::from_secs(1)),
    )
    .await
    .expect("the dashboard starts");
    let base = format!("http://{}", server.local_addr());
    let driver = chromedriver();
    let b = browser(&driver).await;
    let d = Dash {
        server,
        base,
        b,
        _driver: driver,
    };
    let meta = "meta[http-equiv=refresh]";
    for page in ["/", "/queues", "/executions", "/tasks", "/dead-letters"] {
        visit(&d.b, &d.base, page, "refresh-on").await;
        assert_eq!(d.attrs(meta, "content").await, ["1"], "{page} reloads");
    }
    // It does reload: what was shown is replaced.
    let shown = d.element("main").await;
    let mut reloaded = false;
    for _ in 0..200 {
        if shown.text().await.is_err() {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloaded, "the page reloaded itself");
    // Never where the operator types or confirms.
    for page in [
        format!("/executions/{id}"),
        "/login".to_owned(),
        format!("/confirm?action=pause-execution&execution={id}"),
    ] {
        visit(&d.b, &d.base, &page, "refresh-never").await;
        assert!(d.b.find(Locator::Css(meta)).await.is_err(), "{page}");
    }

    // Off: the link keeps the choice for this browser and comes back. It
    // is followed by its address, not clicked: a click can meet the page
    // reloading itself under it.
    d.b.goto(&format!("{}/tasks?queue=q", d.base))
        .await
        .expect("the page");
    d.follow("#refresh-toggle").await;
    assert!(d.text("#refresh").await.starts_with("Not reloading"));
    assert!(
        d.b.current_url()
            .await
            .expect("an address")
            .as_str()
            .ends_with("/tasks?queue=q")
    );
    assert!(d.b.find(Locator::Css(meta)).await.is_err());
    visit(&d.b, &d.base, "/queues", "refresh-off").await;
    assert!(d.b.find(Locator::Css(meta)).await.is_err(), "off everywhere");
    // On again.
    d.follow("#refresh-toggle").await;
    assert!(d.text("#refresh").await.starts_with("This page reloads"));
    assert_eq!(d.attrs(meta, "content").await, ["1"]);
    // The way back is a page of this dashboard only.
    let away = get(&d.base, "/refresh?to=off&back=%2F%2Fevil.example%2F").await;
    assert!(
        away.starts_with("HTTP/1.1 303") && away.contains("location: /\r\n"),
        "{away}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_charts_have_labelled_axes() {
    let c = client();
    let queue = unique("ui-chart");
    c.enqueue(&queue, json!({}), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let d = Dash::start(c.clone(), None).await;
    // Charted from the first sample that sees it, throughput from the
    // second (one a second here).
    let chart = format!("tr[data-queue='{queue}'] svg.chart");
    for _ in 0..200 {
        visit(&d.b, &d.base, "/queues", "queues-chart").await;
        if d.b.find(Locator::Css(&chart)).await.is_ok()
            && d.b.find(Locator::Css("#throughput-chart")).await.is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        d.text(&format!("{chart} .chart-title")).await,
        "ready and running tasks"
    );
    assert_eq!(d.text(&format!("{chart} .axis-max")).await, "1");
    assert_eq!(d.text(&format!("{chart} .axis-zero")).await, "0");
    let times: Vec<String> = {
        let mut out = Vec::new();
        for e in
            d.b.find_all(Locator::Css(&format!("{chart} .axis-time")))
                .await
                .expect("labels")
        {
            out.push(e.text().await.expect("a label"));
        }
        out
    };
    // 90 samples a second apart: the oldest 89 s ago.
    assert_eq!(times, ["-1m 29s", "-44s", "now"]);
    d.element("#throughput-chart .axis-time").await;
    assert_eq!(
        d.text("#throughput-chart .chart-title").await,
        "tasks finished per second"
    );
    d.stop().await;
}

// ---- Task and dead-letter pages, counts by state, search by workflow id ----

/// A time of the CLI's JSON (to the microsecond) as the pages show it (to
/// the millisecond).
fn ms(cli: &serde_json::Value) -> String {
    let at = cli.as_str().expect("a time");
    format!("{}Z", &at[..23])
}

/// The exact text of `css`'s element (its DOM text, whitespace as stored).
async fn exact_text(d: &Dash, css: &str) -> String {
    d.element(css)
        .await
        .prop("textContent")
        .await
        .expect("its text")
        .expect("a text")
}

/// `/tasks/{id}` checked against `sheaf tasks get ID` field by field.
async fn task_page_is_the_clis(d: &Dash, id: TaskId) -> serde_json::Value {
    let (code, cli) = cli_json(&["tasks", "get", &id.to_string()]);
    assert_eq!(code, Some(0), "{cli}");
    let or_dash = |v: &serde_json::Value| if v.is_null() { "-".to_owned() } else { ms(v) };
    let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    for (css, want) in [
        ("#state", text(&cli["state"])),
        ("#queue", text(&cli["queue"])),
        ("#shard", cli["shard"].to_string()),
        ("#kind", text(&cli["kind"])),
        ("#priority", cli["priority"].to_string()),
        (
            "#attempts",
            format!("{} of {}", cli["attempts"], cli["max_attempts"]),
        ),
        (
            "#lease-owner",
            cli["lease_owner"].as_str().unwrap_or("-").to_owned(),
        ),
        ("#started", or_dash(&cli["started_at"])),
        ("#lease-expires", or_dash(&cli["lease_expires_at"])),
        ("#enqueued", ms(&cli["enqueued_at"])),
        ("#run-at", or_dash(&cli["run_at"])),
        ("#dead-at", or_dash(&cli["dead_at"])),
    ] {
        assert_eq!(d.text(css).await, want, "{id} {css}");
    }
    let shown: serde_json::Value =
        serde_json::from_str(&exact_text(d, "#payload").await).expect("the payload is JSON");
    assert_eq!(shown, cli["payload"], "{id}: the payload");
    if cli["progress"].is_null() {
        assert!(d.b.find(Locator::Css("#no-progress")).await.is_ok());
    } else {
        let shown: serde_json::Value =
            serde_json::from_str(&exact_text(d, "#progress").await).expect("the progress is JSON");
        assert_eq!(shown, cli["progress"], "{id}: the progress");
    }
    for css in ["#payload *", "#progress *", "#failure *"] {
        assert!(
            d.b.find_all(Locator::Css(css))
                .await
                .expect("a search")
                .is_empty(),
            "{css}: stored markup is text, not elements"
        );
    }
    cli
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_and_a_dead_letter_have_pages_that_match_the_cli() {
    let c = client();
    let queue = unique("ui-task");
    let run = c
        .start_workflow(&unique("ui-task-wf"), "r", json!({}), StartOptions::new())
        .await
        .expect("start");
    let on = Placement::Shard(run.shard);
    let claim = |worker: &'static str| {
        let (c, queue) = (c.clone(), queue.clone());
        async move {
            c.claim(run.shard, &queue, worker, 1, Duration::from_secs(600))
                .await
                .expect("claim")
                .remove(0)
        }
    };
    // Markup, an escape sequence that would clear a terminal, a bidi
    // override, tabs and runs of spaces, and more than any list shows.
    let error = format!(
        "<b>bold</b> & <script>window.pwned=1</script>\n\tat frame  one \u{1b}[2J \u{202e}cba\n{}\nthe end",
        "x".repeat(3000)
    );
    let shown_error = error
        .replace('\u{1b}', "\\u{1b}")
        .replace('\u{202e}', "\\u{202e}");
    // An activity of the run whose first attempt failed: retried in an hour.
    let failed = c
        .enqueue(
            &queue,
            json!({ "step": "<img src=x onerror=alert(1)>" }),
            EnqueueOptions::new()
                .execution(run.execution_id)
                .max_attempts(3)
                .priority(7),
        )
        .await
        .expect("enqueue")
        .task_id;
    let t = claim("ui-worker-a").await;
    c.fail(t.task_id, t.token, &error, Some(Duration::from_secs(3600)))
        .await
        .expect("failed");
    // A running one, its lease held, with a progress report.
    let secret = unique("a-secret-payload");
    let key = unique("ui-task-key");
    let running = c
        .enqueue(
            &queue,
            json!({ "s": secret }),
            EnqueueOptions::new()
                .placement(on.clone())
                .concurrency_key(&key)
                .priority(3),
        )
        .await
        .expect("enqueue")
        .task_id;
    let t = claim("ui-worker-b").await;
    assert_eq!(t.task_id, running);
    c.set_progress(running, t.token, json!({ "done": 3, "note": "<i>halfway</i>" }))
        .await
        .expect("progress");
    // A dead letter.
    let dead = c
        .enqueue(
            &queue,
            json!({ "d": 1 }),
            EnqueueOptions::new().placement(on).max_attempts(1),
        )
        .await
        .expect("enqueue")
        .task_id;
    let t = claim("ui-worker-c").await;
    assert_eq!(t.task_id, dead);
    c.fail(t.task_id, t.token, &error, None)
        .await
        .expect("dead-lettered");
    let d = Dash::start(c.clone(), Some(TOKEN)).await;

    // The list links each task to its page.
    visit(
        &d.b,
        &d.base,
        &format!("/tasks?queue={queue}"),
        "task-list-linked",
    )
    .await;
    let link = format!("#tasks tr[data-task='{running}'] a[href='/tasks/{running}']");
    d.click(&link).await;
    d.element("#facts").await;
    assert_eq!(console_errors(&d.b).await, Vec::<String>::new());
    save(&d.b, "task").await;
    let cli = task_page_is_the_clis(&d, running).await;
    assert_eq!(cli["state"], "running");
    assert!(cli["started_at"].is_string(), "a running task started: {cli}");
    assert_eq!(d.text("#lease-owner").await, "ui-worker-b");
    assert_eq!(d.text("#concurrency-key").await, key);
    assert!(d.b.find(Locator::Css("#no-failure")).await.is_ok());
    assert!(
        d.b.find(Locator::Css("#cancel")).await.is_ok(),
        "an activity can be cancelled"
    );

    // The failed one: the whole error, escaped, its whitespace kept, and its run.
    visit(&d.b, &d.base, &format!("/tasks/{failed}"), "task-failed").await;
    let cli = task_page_is_the_clis(&d, failed).await;
    assert_eq!(
        cli["last_error"],
        error.as_str(),
        "the shard kept the whole error"
    );
    assert_eq!(exact_text(&d, "#failure").await, shown_error);
    assert_eq!(
        d.element("#failure")
            .await
            .css_value("white-space")
            .await
            .expect("a style"),
        "pre-wrap"
    );
    assert_eq!(
        d.attrs("#execution a", "href").await,
        [format!("/executions/{}", run.execution_id)]
    );
    // The run's history links the task's event to the task's page.
    visit(
        &d.b,
        &d.base,
        &format!("/executions/{}", run.execution_id),
        "execution-task-linked",
    )
    .await;
    d.click(&format!("#history a.task[href='/tasks/{failed}']")).await;
    d.element("#facts").await;
    assert_eq!(d.text("#state").await, "scheduled");

    // The dead letter: listed with a link, its page with the error and a redrive.
    visit(
        &d.b,
        &d.base,
        &format!("/dead-letters?queue={queue}"),
        "dead-list-linked",
    )
    .await;
    d.click(&format!(
        "#dead-letters tr[data-task='{dead}'] a[href='/dead-letters/{dead}']"
    ))
    .await;
    d.element("#facts").await;
    assert_eq!(console_errors(&d.b).await, Vec::<String>::new());
    save(&d.b, "dead-letter").await;
    let cli = task_page_is_the_clis(&d, dead).await;
    assert_eq!(cli["state"], "dead");
    assert_eq!(exact_text(&d, "#failure").await, shown_error);
    assert!(d.b.find(Locator::Css("#redrive")).await.is_ok());
    assert!(d.b.find(Locator::Css("#cancel")).await.is_err());

    // A task that is not a dead letter, a malformed id, an unknown one.
    for (path, status_error) in [
        (format!("/dead-letters/{running}"), "is not a dead letter"),
        ("/tasks/not-a-task".to_owned(), "id: not a task id"),
        ("/dead-letters/not-a-task".to_owned(), "id: not a task id"),
        (
            format!("/tasks/{}", TaskId::mint(run.shard).expect("an id")),
            "no task",
        ),
    ] {
        d.b.goto(&format!("{}{path}", d.base)).await.expect("the page");
        let shown = d.text("#error").await;
        assert!(shown.contains(status_error), "{path}: {shown}");
        assert_eq!(console_errors(&d.b).await.len(), 1, "{path}: its 400 or 404");
    }
    d.b.goto(&format!("{}/dead-letters/{running}", d.base))
        .await
        .expect("the page");
    assert_eq!(d.attrs("#see", "href").await, [format!("/tasks/{running}")]);
    let _ = console_errors(&d.b).await;
    d.stop().await;

    // Signed out, without --public-read: ids, states and times, no payload.
    let (server, base) = signed_out_dashboard(c.clone()).await;
    for path in [format!("/tasks/{running}"), format!("/dead-letters/{dead}")] {
        let page = get(&base, &path).await;
        assert!(page.starts_with("HTTP/1.1 200"), "{path}: {page}");
        assert!(page.contains("payloads-hidden"), "{path}");
        for hidden in [secret.as_str(), "halfway", "window.pwned"] {
            assert!(!page.contains(hidden), "{path} shows {hidden} signed out");
        }
    }
    for (path, status) in [
        ("/tasks/nope".to_owned(), "400"),
        (
            format!("/tasks/{}", TaskId::mint(run.shard).expect("an id")),
            "404",
        ),
    ] {
        let page = get(&base, &path).await;
        assert!(page.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {page}");
    }
    let read = signed_in_get(&base, "127.0.0.4", &format!("/tasks/{running}")).await;
    assert!(read.contains(&secret), "a session reads the payload");
    server.shutdown().await;
}

/// `sheaf --json ARGS` against the fleet `spec`: its JSON.
fn cli_on(spec: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(sheaf_tests::cli_binary())
        .arg("--json")
        .args(args)
        .env("SHEAF_SHARDS", spec)
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .output()
        .expect("the CLI runs");
    assert!(out.status.success(), "sheaf {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The counts row of the page shown: state → what its cell says.
async fn counts_shown(d: &Dash) -> std::collections::BTreeMap<String, String> {
    let mut shown = std::collections::BTreeMap::new();
    for cell in
        d.b.find_all(Locator::Css("#counts td[data-state]"))
            .await
            .expect("cells")
    {
        let state = cell.attr("data-state").await.expect("a state").expect("a state");
        shown.insert(state, cell.text().await.expect("a count"));
    }
    shown
}

/// Follows the link of `state`'s count and waits for its list.
async fn follow_count(d: &Dash, state: &str) {
    d.click(&format!("#counts td[data-state='{state}'] a")).await;
    for _ in 0..100 {
        if let Ok(at) = d.b.current_url().await
            && at.as_str().contains(&format!("state={state}"))
        {
            d.element("main").await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the list of {state} did not load");
}

/// The execution ids the executions page shows.
async fn executions_shown(d: &Dash) -> Vec<String> {
    d.attrs("#executions tr[data-execution]", "data-execution").await
}

// One story, told in order, on a fleet of its own (its counts are exact).
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_by_state_and_a_search_by_workflow_id_cover_the_fleet() {
    let own = |args: &[&str]| sheaf_tests::own_shards("ui-detail", 28300, args);
    let spec = own(&["up", "--count", "2", "--no-install"]);
    let topology = Topology::parse(&spec).expect("shards");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2));
    let c = Arc::new(Client::new(topology, options).expect("a client"));
    let (s0, s1) = (ShardId::new(0).expect("0"), ShardId::new(1).expect("1"));
    let queue = unique("ui-count");
    let enqueue = |on: ShardId, options: EnqueueOptions| {
        let (c, queue) = (c.clone(), queue.clone());
        async move {
            c.enqueue(&queue, json!({}), options.placement(Placement::Shard(on)))
                .await
                .expect("enqueue")
        }
    };
    // Shard 0: two dead letters, three ready tasks, and a key at its cap of
    // 1 with one more ready and one waiting. Shard 1: two scheduled, one running.
    dead_letters(&c, &queue, s0, 2, "boom").await;
    for _ in 0..3 {
        enqueue(s0, EnqueueOptions::new()).await;
    }
    let key = unique("ui-count-key");
    c.admin()
        .set_concurrency_limit(&key, Some(1))
        .await
        .into_result()
        .expect("a cap on every shard");
    for _ in 0..2 {
        enqueue(s0, EnqueueOptions::new().concurrency_key(&key)).await;
    }
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    for _ in 0..2 {
        enqueue(s1, EnqueueOptions::new().run_at(later)).await;
    }
    enqueue(s1, EnqueueOptions::new()).await;
    c.claim(s1, &queue, "w", 1, Duration::from_secs(600))
        .await
        .expect("claim");
    let want: std::collections::BTreeMap<String, String> = [
        ("ready", 4),
        ("scheduled", 2),
        ("running", 1),
        ("waiting", 1),
        ("paused", 0),
        ("dead", 2),
    ]
    .into_iter()
    .map(|(s, n)| (s.to_owned(), n.to_string()))
    .collect();
    let d = Dash::start(c.clone(), None).await;

    // The tasks page: the queue's counts are the CLI's, each state's links to its list.
    visit(&d.b, &d.base, &format!("/tasks?queue={queue}"), "task-counts").await;
    assert_eq!(counts_shown(&d).await, want);
    let cli = cli_on(&spec, &["queues"]);
    let total = &cli["queues"][0]["total"];
    assert_eq!(cli["queues"][0]["queue"], queue.as_str());
    for (state, n) in &want {
        assert_eq!(&total[state].to_string(), n, "the CLI's {state}");
    }
    assert!(d.b.find(Locator::Css("#counts-partial")).await.is_err());
    follow_count(&d, "scheduled").await;
    assert_eq!(d.attrs("#tasks tr[data-task]", "data-task").await.len(), 2);
    // Before a queue is chosen: every queue's (this fleet has one).
    visit(&d.b, &d.base, "/tasks", "task-counts-fleet").await;
    assert_eq!(counts_shown(&d).await, want);

    // Executions: five runs of a workflow over both shards, one cancelled,
    // and one run of another workflow.
    let wf = unique("ui-count-wf");
    let mut runs = Vec::new();
    for n in 0..5 {
        let on = if n % 2 == 0 { s0 } else { s1 };
        let started = c
            .start_workflow(
                &wf,
                &format!("r{n}"),
                json!({}),
                StartOptions::new().placement(Placement::Shard(on)),
            )
            .await
            .expect("start");
        runs.push(started.execution_id);
    }
    assert!(c.cancel_execution(runs[0], None).await.expect("cancelled"));
    c.start_workflow(&unique("ui-count-other"), "r", json!({}), StartOptions::new())
        .await
        .expect("start");
    let by_state = |running: usize, cancelled: usize| {
        let mut m = std::collections::BTreeMap::new();
        for s in sheaf_core::state::ExecutionState::ALL {
            m.insert(s.as_str().to_owned(), "0".to_owned());
        }
        m.insert("RUNNING".into(), running.to_string());
        m.insert("CANCELLED".into(), cancelled.to_string());
        m
    };
    visit(&d.b, &d.base, "/executions", "execution-counts").await;
    assert_eq!(counts_shown(&d).await, by_state(5, 1), "the whole fleet");
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={wf}"),
        "execution-counts-filtered",
    )
    .await;
    assert_eq!(counts_shown(&d).await, by_state(4, 1), "the filter's");
    follow_count(&d, "RUNNING").await;
    assert_eq!(executions_shown(&d).await.len(), 4);

    // Search by workflow id, from the form; jump to an execution by its id.
    let field = |css: &'static str| d.element(css);
    field("#find input[name=workflow]")
        .await
        .clear()
        .await
        .expect("cleared");
    field("#find input[name=workflow]")
        .await
        .send_keys(&wf)
        .await
        .expect("typed");
    field("#find input[name=workflow_id]")
        .await
        .send_keys("r3")
        .await
        .expect("typed");
    d.click("#find button").await;
    d.element("#found").await;
    assert_eq!(executions_shown(&d).await, [runs[3].to_string()]);
    assert_eq!(console_errors(&d.b).await, Vec::<String>::new());
    save(&d.b, "execution-found").await;
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={wf}&workflow_id=r9"),
        "execution-not-found",
    )
    .await;
    assert!(d.text("#found").await.contains("No shard holds"));
    assert!(executions_shown(&d).await.is_empty());
    field("#jump input[name=id]")
        .await
        .send_keys(&runs[1].to_string())
        .await
        .expect("typed");
    d.click("#jump button").await;
    d.element("#lives").await;
    assert!(
        d.b.current_url()
            .await
            .expect("an address")
            .as_str()
            .ends_with(&format!("/executions/{}", runs[1])),
        "at the execution's page"
    );
    assert_eq!(console_errors(&d.b).await, Vec::<String>::new());
    for (path, param) in [
        ("/executions?workflow_id=r3".to_owned(), "workflow_id:"),
        (
            format!("/executions?workflow={wf}&workflow_id=r3&state=RUNNING"),
            "workflow_id:",
        ),
        ("/executions?id=not-an-id".to_owned(), "id:"),
    ] {
        d.b.goto(&format!("{}{path}", d.base)).await.expect("the page");
        assert!(d.text("#error").await.starts_with(param), "{path}");
        assert_eq!(console_errors(&d.b).await.len(), 1, "{path}: its 400");
    }

    // With shard 1 stopped, each count says it is partial, and a search
    // that may miss a run says so.
    own(&["stop-one", "1"]);
    visit(
        &d.b,
        &d.base,
        &format!("/tasks?queue={queue}"),
        "task-counts-partial",
    )
    .await;
    assert!(d.b.find(Locator::Css("#counts-partial")).await.is_ok());
    assert!(d.text("#partial").await.contains("shard 1"));
    assert_eq!(d.text("#counts td[data-state='ready']").await, "4", "shard 0's");
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={wf}"),
        "execution-counts-partial",
    )
    .await;
    assert!(d.b.find(Locator::Css("#counts-partial")).await.is_ok());
    assert_eq!(counts_shown(&d).await, by_state(2, 1), "shard 0's runs");
    visit(
        &d.b,
        &d.base,
        &format!("/executions?workflow={wf}&workflow_id=r1"),
        "execution-search-partial",
    )
    .await;
    assert!(d.text("#found").await.contains("may hold"));
    assert!(d.text("#partial").await.contains("shard 1"));
    d.stop().await;
    own(&["down"]);
}

// --- Schedules, rate limits, live workers and the audit log (helper "pages").

/// The rows' `attr` of table `table` on the page as shown now.
async fn rows_of(d: &Dash, table: &str, attr: &str) -> Vec<String> {
    d.attrs(&format!("#{table} tr[{attr}]"), attr).await
}

// One story, told in order: each step builds on the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedules_rate_limits_workers_and_the_audit_log_have_pages() {
    use sheaf_driver::protocol::Steps;
    let c = client();
    let default = fleet().default_shard();
    let schedule = unique("ui-sched");
    let markup = "<script>window.pwned=1</script>";
    c.admin()
        .create_schedule(
            &schedule,
            json!({"cron": "0 3 * * *", "workflow": {"name": unique("ui-nightly"), "input": {"note": markup}}}),
        )
        .await
        .expect("a schedule");
    let limit = unique("ui-rl");
    c.admin()
        .declare_rate_limit(&limit, json!({"rate": 5, "period": "1s", "burst": 7}))
        .await
        .into_result()
        .expect("declared on every shard");
    c.admin()
        .set_rate_override(
            &limit,
            2.0,
            Duration::from_secs(60),
            std::time::SystemTime::now() + Duration::from_secs(3600),
        )
        .await
        .expect("an override");
    let worker = unique("ui-worker");
    let served = vec![unique("ui-wq")];
    let d = Dash::start(c.clone(), Some(TOKEN)).await;

    // Schedules: the page's row is the CLI's, its spec shown as text.
    visit(&d.b, &d.base, &format!("/schedules?name={schedule}"), "schedules").await;
    let (code, cli) = cli_json(&["schedules", "list"]);
    assert_eq!(code, Some(0), "{cli}");
    let listed: Vec<&serde_json::Value> = cli["schedules"]
        .as_array()
        .expect("schedules")
        .iter()
        .filter(|s| s["name"] == schedule.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{cli}");
    assert_eq!(
        rows_of(&d, "schedules", "data-schedule").await,
        [schedule.as_str()]
    );
    let row = format!("#schedules tr[data-schedule='{schedule}']");
    assert_eq!(
        d.attrs(&row, "data-shard").await,
        [listed[0]["shard"].to_string()]
    );
    assert_eq!(d.text(&format!("{row} td.state")).await, "active");
    assert!(d.text(&format!("{row} code.spec")).await.contains(markup));
    let untouched =
        d.b.execute("return window.pwned === undefined", vec![])
            .await
            .expect("a script runs");
    assert_eq!(untouched, json!(true), "markup in a spec stays text");
    visit(
        &d.b,
        &d.base,
        &format!("/schedules?name={schedule}&state=paused"),
        "schedules-paused",
    )
    .await;
    assert!(
        rows_of(&d, "schedules", "data-schedule").await.is_empty(),
        "a filter narrows"
    );

    // Rate limits: declared on every shard, overridden on every readable one.
    visit(
        &d.b,
        &d.base,
        &format!("/rate-limits?name={limit}"),
        "rate-limits",
    )
    .await;
    let (code, cli) = cli_json(&["rate-limits", "list"]);
    assert_eq!(code, Some(0), "{cli}");
    let mut cli_shards: Vec<String> = cli["rate_limits"]
        .as_array()
        .expect("rate limits")
        .iter()
        .filter(|l| l["name"] == limit.as_str())
        .map(|l| l["shard"].as_str().expect("a shard").to_owned())
        .collect();
    cli_shards.sort();
    assert_eq!(cli_shards.len(), fleet().shards().count());
    let mut shown = d.attrs("#rate-limits tr[data-limit]", "data-shard").await;
    shown.sort();
    assert_eq!(shown, cli_shards);
    let first = format!("#rate-limits tr[data-limit='{limit}']");
    assert_eq!(
        d.text(&format!("{first} td:nth-child(5)")).await,
        "7",
        "its burst"
    );
    let paced = d.text(&format!("{first} td.override")).await;
    assert!(paced.starts_with("2 per 1m until "), "{paced}");

    // Live workers: the one heartbeat, as the CLI's status lists it (each
    // read just after a heartbeat: a worker is live for 60 s after one).
    let beat = || c.protocol().worker_heartbeat(default, &worker, &served);
    beat().await.expect("a heartbeat");
    visit(&d.b, &d.base, &format!("/workers?name={worker}"), "workers").await;
    beat().await.expect("a heartbeat");
    let (_, status) = cli_json(&["status"]);
    let cli_on: Vec<String> = status["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .filter(|s| {
            s["live_workers"]
                .as_array()
                .is_some_and(|w| w.iter().any(|w| w["name"] == worker.as_str()))
        })
        .map(|s| s["shard"].to_string())
        .collect();
    assert_eq!(cli_on, [default.to_string()]);
    assert_eq!(d.attrs("#workers tr[data-worker]", "data-shard").await, cli_on);
    assert_eq!(
        d.text(&format!("#workers tr[data-worker='{worker}'] td.queues"))
            .await,
        served[0]
    );

    // Bad parameters are a 400 naming the parameter.
    for (path, param) in [
        ("/schedules?state=sleepy", "state"),
        ("/audit?shard=99", "shard"),
        ("/audit?shard=x", "shard"),
        ("/audit?before=-1", "before"),
        ("/audit?before=soon", "before"),
        ("/confirm?action=pause_schedule", "schedule"),
    ] {
        let answer = get(&d.base, path).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains(&format!("{param}:")), "{path} names {param}");
    }

    // Pausing needs a session: signed out, it is refused and nothing changes.
    let pause_button = format!("{row} button");
    d.b.goto(&format!("{}/schedules?name={schedule}", d.base))
        .await
        .expect("the page");
    d.click(&pause_button).await;
    assert!(d.text("#what").await.starts_with("Pause schedule"));
    assert!(d.b.find(Locator::Css("#signed-out")).await.is_ok());
    d.click("#do-it").await;
    assert!(d.text("#refused").await.contains("sign in"));
    assert_eq!(console_errors(&d.b).await.len(), 1, "only the 403");
    assert!(!paused(&c, &schedule).await);

    // Signed in: confirmed, done, and audited with the session's actor.
    // A name of its own: the audit log is compared below by actor.
    let operator = unique("scheduler");
    let actor = format!("ui:{operator}");
    assert!(sign_in(&d, &operator, TOKEN).await);
    d.b.goto(&format!("{}/schedules?name={schedule}", d.base))
        .await
        .expect("the page");
    d.click(&pause_button).await;
    d.click("#do-it").await;
    assert_eq!(
        d.text(".result").await,
        format!("Schedule \"{schedule}\" paused.")
    );
    assert!(paused(&c, &schedule).await);
    visit(
        &d.b,
        &d.base,
        &format!("/schedules?name={schedule}"),
        "schedules-after",
    )
    .await;
    assert_eq!(d.text(&format!("{row} td.state")).await, "paused");

    // A forged POST without the session's CSRF token is refused.
    let (cookie, _) = session_of(&d).await;
    let forged = post(
        &d.base,
        "/act/resume_schedule",
        &format!("schedule={schedule}&csrf=guess"),
        &cookie,
        None,
    )
    .await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    assert!(paused(&c, &schedule).await, "still paused");
    d.click(&pause_button).await;
    assert!(d.text("#what").await.starts_with("Resume schedule"));
    d.click("#do-it").await;
    assert_eq!(
        d.text(".result").await,
        format!("Schedule \"{schedule}\" resumed.")
    );
    assert!(!paused(&c, &schedule).await);

    // The audit log, filtered to this session's actor: both actions, newest
    // first, as the shard's log (and the CLI) hold them.
    visit(
        &d.b,
        &d.base,
        &format!("/audit?shard={default}&actor={actor}"),
        "audit",
    )
    .await;
    let actions: Vec<String> = {
        let mut out = Vec::new();
        for e in
            d.b.find_all(Locator::Css("#audit tr[data-entry] td.action"))
                .await
                .expect("cells")
        {
            out.push(e.text().await.expect("a cell"));
        }
        out
    };
    assert_eq!(actions, ["resume_schedule", "pause_schedule"]);
    let shown = rows_of(&d, "audit", "data-entry").await;
    let (code, cli) = cli_json(&["audit", "--limit", "1000"]);
    assert_eq!(code, Some(0), "{cli}");
    let cli_ids: Vec<String> = cli["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["actor"] == actor.as_str() && e["shard"] == default.get())
        .map(|e| e["id"].to_string())
        .collect();
    assert_eq!(shown, cli_ids);
    visit(
        &d.b,
        &d.base,
        &format!("/audit?shard={default}&action=pause_schedule&actor={actor}"),
        "audit-filtered",
    )
    .await;
    assert_eq!(rows_of(&d, "audit", "data-entry").await, cli_ids[1..]);
    // Unfiltered, the log pages by id without repeating an entry.
    visit(&d.b, &d.base, &format!("/audit?shard={default}"), "audit-all").await;
    let page_one = rows_of(&d, "audit", "data-entry").await;
    if page_one.len() == 50 {
        let next = d.attrs("#next", "href").await.remove(0);
        assert!(next.ends_with(&format!("before={}", page_one[49])), "{next}");
        visit(&d.b, &d.base, &next, "audit-next").await;
        let page_two = rows_of(&d, "audit", "data-entry").await;
        let last: i64 = page_one[49].parse().expect("an id");
        assert!(
            page_two.iter().all(|id| id.parse::<i64>().expect("an id") < last),
            "the next page is older"
        );
    }
    d.stop().await;

    // Without public read, a visitor not signed in sees no spec or detail.
    let hidden = UiServer::start(
        c.clone(),
        "127.0.0.1:0".parse().expect("an address"),
        UiOptions::default(),
    )
    .await
    .expect("the dashboard starts");
    let base = format!("http://{}", hidden.local_addr());
    for path in [
        format!("/schedules?name={schedule}"),
        // The schedule's creation, its spec (with the markup) as detail.
        format!("/audit?shard={default}&action=create_schedule"),
    ] {
        let page = get(&base, &path).await;
        assert!(page.starts_with("HTTP/1.1 200"), "{path}: {page}");
        assert!(
            page.contains("hidden-payload") && !page.contains("window.pwned"),
            "{path}: {page}"
        );
    }
    hidden.shutdown().await;
    c.admin().delete_schedule(&schedule).await.expect("deleted");
    c.protocol()
        .worker_deregister(default, &worker)
        .await
        .expect("deregistered");
}

async fn paused(c: &Client, schedule: &str) -> bool {
    c.admin()
        .list_schedules()
        .await
        .ok
        .values()
        .flatten()
        .find(|s| s.name == schedule)
        .expect("the schedule")
        .paused
}

// --- The mutexes page (helper "mutexes").

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mutexes_page_shows_a_held_key_with_its_holder_and_waiters() {
    use sheaf_driver::{Acquired, MutexKey};
    let c = client();
    let prefix = unique("ui-mx");
    let shard = fleet().default_shard();
    let key = MutexKey::on_shard(format!("{prefix}-<b>lock</b>"), shard);
    let lease = Duration::from_secs(600);
    let holder = uuid::Uuid::new_v4();
    let Acquired::Granted { token } = c.mutex_acquire(&key, holder, lease).await.expect("acquire") else {
        panic!("a free key is granted");
    };
    let waiters = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    for w in waiters {
        c.mutex_acquire(&key, w, lease).await.expect("queued");
    }
    let d = Dash::start(c.clone(), None).await;
    let from = sheaf_tests::mutexes_from(&prefix);
    let path = format!("/mutexes?cursor={from}");
    visit(&d.b, &d.base, &path, "mutexes").await;
    assert_eq!(
        d.attrs("header a.here", "href").await,
        ["/mutexes"],
        "the nav links the page"
    );
    let row = format!("#mutexes tr[data-key='{}']", key.key());
    assert_eq!(d.attrs(&row, "data-shard").await, [shard.to_string()]);
    assert_eq!(d.text(&format!("{row} td.holder")).await, holder.to_string());
    assert_eq!(d.text(&format!("{row} td.waiters")).await, "2");
    assert_eq!(
        d.text(&format!("{row} td:first-child")).await,
        key.key(),
        "markup in a key stays text"
    );
    // The CLI's page from the same place says the same.
    let (code, cli) = cli_json(&["mutexes", "list", "--cursor", &from, "--page-size", "50"]);
    assert_eq!(code, Some(0), "{cli}");
    let listed = cli["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|m| m["key"] == key.key())
        .expect("the CLI lists the key")
        .clone();
    assert_eq!(listed["holder"], holder.to_string());
    assert_eq!(listed["token"], token);
    assert_eq!(listed["waiters"], 2);
    assert_eq!(listed["shard"], shard.get());
    d.stop().await;

    // A cursor that is not one is a 400 naming it.
    let (server, base) = signed_out_dashboard(c.clone()).await;
    let answer = get(&base, "/mutexes?cursor=bogus").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("cursor:"), "{answer}");
    assert!(!answer.contains("did not answer"), "{answer}");
    server.shutdown().await;

    for w in waiters {
        c.mutex_leave(&key, w).await.expect("leave");
    }
    c.mutex_release(&key, holder, token).await.expect("release");
}
