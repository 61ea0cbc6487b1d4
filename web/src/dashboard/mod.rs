//! The fleet dashboard (`sheaf serve`): pages rendered on the
//! server from the client's bounded fan-out reads, escaped by the templates
//! (`web/templates`), with no script. A page names a shard that did not
//! answer in its partial banner, and never shows a connection string.
//!
//! Pages, one module each: the fleet (`fleet`), queues with their depth
//! over the last minutes and the concurrency keys near their caps
//! (`queues`), executions and an execution's page (`executions`), dead
//! letters (`dead_letters`), tasks (`tasks`), a task's or a dead letter's
//! page (`task`), usage (`usage`), rebalancing (`rebalance`), schedules
//! (`schedules`), rate limits (`rate_limits`), live workers (`workers`),
//! a shard's audit log (`audit`) and the held mutexes (`mutexes`). Actions (redrive, purge, cancel a
//! task; pause or resume a schedule; cancel, terminate, signal, pause or
//! resume an execution: `runs`) need a signed-in session (`session`) and
//! a confirmation (`actions`).

/// A rendered page: a template with the chrome around its content.
trait Page: askama::Template {
    fn chrome(&mut self) -> &mut Chrome;
}

/// Makes each template struct (with a `chrome` field) a [`Page`].
macro_rules! pages {
    ($($t:ty),* $(,)?) => {
        $(impl super::Page for $t {
            fn chrome(&mut self) -> &mut super::Chrome {
                &mut self.chrome
            }
        })*
    };
}

mod actions;
mod audit;
mod dead_letters;
mod executions;
mod fleet;
mod mutexes;
mod queues;
mod rate_limits;
mod rebalance;
mod refresh;
mod runs;
mod schedules;
mod session;

pub(crate) use session::same;
mod task;
mod tasks;
mod usage;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use sheaf_driver::ShardId;
use sheaf_driver::served::Served;
use sheaf_driver::{Client, ClientError, FleetReport};

/// How the dashboard reads the fleet and who may act on it.
/// `UiOptions::new()` takes the defaults; each setter says what it sets.
#[derive(Clone)]
#[non_exhaustive]
pub struct UiOptions {
    pub(crate) probe_timeout: Duration,
    pub(crate) admin_token: Option<String>,
    pub(crate) sample_every: Duration,
    pub(crate) public_hosts: Vec<String>,
    pub(crate) api_tokens: crate::api::Tokens,
    pub(crate) public_read: bool,
    pub(crate) refresh_every: Duration,
}

impl UiOptions {
    /// The defaults (as [`Default`]).
    pub fn new() -> UiOptions {
        UiOptions::default()
    }

    /// The longest a shard's probe may take on the fleet page (default 3 s).
    pub fn probe_timeout(mut self, probe_timeout: Duration) -> Self {
        self.probe_timeout = probe_timeout;
        self
    }

    /// The admin token that signs a session in (`SHEAF_UI_TOKEN` for
    /// `sheaf serve`); `None`: the dashboard is read-only.
    pub fn admin_token(mut self, admin_token: Option<String>) -> Self {
        self.admin_token = admin_token;
        self
    }

    /// How often the queues' depth is sampled for their charts (default
    /// 10 s; at least 1 s). The last 90 samples of each queue are kept.
    pub fn sample_every(mut self, sample_every: Duration) -> Self {
        self.sample_every = sample_every;
        self
    }

    /// The names (`host` or `host:port`) the dashboard answers to besides
    /// its listening address and, when it listens on loopback or every
    /// address, `localhost`, `127.0.0.1` and `[::1]` with its port. A
    /// request naming another host is refused (421), so a web page cannot
    /// read the dashboard through a name of its own that resolves here.
    pub fn public_hosts(mut self, public_hosts: Vec<String>) -> Self {
        self.public_hosts = public_hosts;
        self
    }
}

impl UiOptions {
    /// The bearer tokens of the HTTP API (`/api/v1`, docs/operating/api.md):
    /// `read` ones read, `act` ones also act (`SHEAF_API_READ_TOKENS` and
    /// `SHEAF_API_ACT_TOKENS` for `sheaf serve`). None: the API refuses
    /// every call.
    pub fn api_tokens(mut self, read: Vec<String>, act: Vec<String>) -> Self {
        self.api_tokens = crate::api::Tokens::new(read, act);
        self
    }

    /// Whether pages show payloads (inputs, results, errors, history
    /// payloads, search attributes) to visitors who are not signed in
    /// (default `false`: they see ids, counts, states and times only).
    pub fn public_read(mut self, public_read: bool) -> Self {
        self.public_read = public_read;
        self
    }

    /// How often a list page (fleet, queues, executions, tasks, dead
    /// letters) reloads itself (default 10 s, whole seconds; zero: never).
    /// An operator turns it off and on per browser with the page's link.
    pub fn refresh_every(mut self, refresh_every: Duration) -> Self {
        self.refresh_every = refresh_every;
        self
    }
}

impl std::fmt::Debug for UiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UiOptions")
            .field("probe_timeout", &self.probe_timeout)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<set>"))
            .field("sample_every", &self.sample_every)
            .field("public_hosts", &self.public_hosts)
            .field("api_tokens", &self.api_tokens.enabled().then_some("<set>"))
            .field("public_read", &self.public_read)
            .field("refresh_every", &self.refresh_every)
            .finish()
    }
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions {
            probe_timeout: Duration::from_secs(3),
            admin_token: None,
            sample_every: Duration::from_secs(10),
            public_hosts: Vec::new(),
            api_tokens: crate::api::Tokens::default(),
            public_read: false,
            refresh_every: Duration::from_secs(refresh::EVERY),
        }
    }
}

struct Shared {
    client: Arc<Client>,
    options: UiOptions,
    sessions: session::Sessions,
    depth: queues::Depth,
    throughput: queues::Throughput,
    usage: usage::Kept,
}

/// A running dashboard.
pub struct UiServer {
    addr: SocketAddr,
    served: Option<Served>,
    sampler: Option<JoinHandle<()>>,
    stop: CancellationToken,
}

impl UiServer {
    /// Serves the dashboard on `listen` (port 0: any free port, see
    /// [`UiServer::local_addr`]).
    pub async fn start(
        client: Arc<Client>,
        listen: SocketAddr,
        options: UiOptions,
    ) -> std::io::Result<UiServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let hosts = Arc::new(known_hosts(listener.local_addr()?, &options.public_hosts));
        let options = UiOptions {
            sample_every: options.sample_every.max(Duration::from_secs(1)),
            ..options
        };
        let shared = Arc::new(Shared {
            client,
            sessions: session::Sessions::new(options.admin_token.clone()),
            depth: queues::Depth::default(),
            throughput: queues::Throughput::default(),
            usage: usage::Kept::default(),
            options,
        });
        let api = crate::api::ApiState::new(
            shared.client.clone(),
            shared.options.api_tokens.clone(),
            shared.options.probe_timeout,
        )
        .map_err(std::io::Error::other)?;
        let (api, _) = crate::api::routes(Arc::new(api));
        let metrics = crate::metrics::routes(shared.client.clone());
        let stop = CancellationToken::new();
        let sampler = tokio::spawn(queues::sample(shared.clone(), stop.clone()));
        let app = Router::new()
            .route("/", get(fleet::page))
            .route("/queues", get(queues::page))
            .route("/executions", get(executions::list))
            .route("/executions/{id}", get(executions::one))
            .route("/dead-letters", get(dead_letters::page))
            .route("/dead-letters/{id}", get(task::dead_letter))
            .route("/tasks", get(tasks::page))
            .route("/tasks/{id}", get(task::task))
            .route("/usage", get(usage::page))
            .route("/rebalance", get(rebalance::page))
            .route("/schedules", get(schedules::page))
            .route("/rate-limits", get(rate_limits::page))
            .route("/workers", get(workers::page))
            .route("/audit", get(audit::page))
            .route("/mutexes", get(mutexes::page))
            .route("/login", get(session::login_page).post(session::login))
            .route("/logout", post(session::logout))
            .route("/confirm", get(actions::confirm))
            .route("/act/{action}", post(actions::act))
            .route("/refresh", get(refresh::switch))
            .route("/favicon.ico", get(icon))
            .with_state(shared)
            .layer(axum::middleware::from_fn(plain_query))
            .merge(api)
            .merge(metrics)
            .layer(axum::middleware::from_fn_with_state(hosts, known_host));
        let served = Served::spawn(listener, app, "dashboard")?;
        Ok(UiServer {
            addr: served.local_addr(),
            served: Some(served),
            sampler: Some(sampler),
            stop,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and sampling, and waits until it has.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(served) = self.served.take() {
            served.shutdown().await;
        }
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.await;
        }
    }
}

impl Drop for UiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What every page shows around its content (`base.html`).
struct Chrome {
    title: &'static str,
    page: &'static str,
    /// The shards that did not answer, for the partial banner.
    unavailable: Vec<String>,
    rendered_ms: String,
    /// Who is signed in (`ui:<name>`), if anyone.
    actor: Option<String>,
    /// The session's CSRF token for action forms ("" when signed out).
    csrf: String,
    /// Whether an admin token is configured (actions possible at all).
    can_act: bool,
    /// Whether payloads are shown: to a session, or to anyone with
    /// [`UiOptions::public_read`].
    payloads: bool,
    /// A list page's auto-refresh (`refresh`); `None` elsewhere.
    refresh: Option<refresh::Refresh>,
    began: Instant,
}

impl Chrome {
    fn new(shared: &Shared, headers: &HeaderMap, title: &'static str) -> Chrome {
        let session = shared.sessions.current(headers);
        Chrome {
            title,
            page: title,
            unavailable: Vec::new(),
            rendered_ms: String::new(),
            payloads: session.is_some() || shared.options.public_read,
            actor: session.as_ref().map(|s| s.actor.clone()),
            csrf: session.map(|s| s.csrf.clone()).unwrap_or_default(),
            can_act: shared.sessions.enabled(),
            refresh: None,
            began: Instant::now(),
        }
    }

    /// Makes this list page (at `path` with query `raw`) reload itself,
    /// unless this browser turned that off.
    fn refreshing(&mut self, every: Duration, headers: &HeaderMap, path: &str, raw: Option<&str>) {
        self.refresh = refresh::Refresh::of(every, headers, path, raw);
    }

    /// Names the shard of a failed call in the banner, when one could not
    /// serve it.
    fn failed(&mut self, e: &ClientError) {
        if let Some(shard) = Chrome::shard_of(e) {
            self.missing([&shard]);
        }
    }

    /// The shard that could not serve a failed call, if one could not.
    fn shard_of(e: &ClientError) -> Option<ShardId> {
        match e {
            ClientError::Shard { error, .. } => Some(error.shard()),
            _ => None,
        }
    }

    /// Names the shards of a partial answer in the banner.
    fn missing<'a>(&mut self, shards: impl IntoIterator<Item = &'a ShardId>) {
        for s in shards {
            let s = s.to_string();
            if !self.unavailable.contains(&s) {
                self.unavailable.push(s);
            }
        }
    }
}

/// Counts by state above a list (`counts.html`), each linking to the list
/// of that state.
struct Counts {
    /// What is counted, as a heading ("tasks of queue q").
    what: String,
    cells: Vec<Count>,
    /// A shard did not answer: what it holds is not counted.
    partial: bool,
    /// Each shard's count stops at a bound (a count shown as `N+`).
    bounded: Option<usize>,
}

struct Count {
    state: &'static str,
    shown: String,
    /// The list of that state ("": none to link to).
    href: String,
}

/// A page rendered with its time taken, or a plain 500 naming the template
/// error (never data).
fn render(status: StatusCode, mut p: impl Page) -> Response {
    let c = p.chrome();
    c.rendered_ms = format!("{:.1}", c.began.elapsed().as_secs_f64() * 1000.0);
    match p.render() {
        Ok(html) => (
            status,
            [
                (header::CACHE_CONTROL, "no-store"),
                (
                    header::HeaderName::from_static("x-content-type-options"),
                    "nosniff",
                ),
                (header::HeaderName::from_static("referrer-policy"), "same-origin"),
                (header::HeaderName::from_static("x-frame-options"), "DENY"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
                     form-action 'self'; frame-ancestors 'none'",
                ),
            ],
            Html(html),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page could not be rendered: {e}"),
        )
            .into_response(),
    }
}

/// The `Host` values the dashboard answers to (lowercase).
fn known_hosts(addr: SocketAddr, public: &[String]) -> Vec<String> {
    let port = addr.port();
    let mut hosts = Vec::new();
    let ip = addr.ip();
    if ip.is_loopback() || ip.is_unspecified() {
        for name in ["localhost", "127.0.0.1", "[::1]"] {
            hosts.push(format!("{name}:{port}"));
        }
    }
    if !ip.is_unspecified() {
        hosts.push(SocketAddr::new(ip, port).to_string());
    }
    for name in public {
        let name = name.trim().to_ascii_lowercase();
        // `host` or `[v6]` without a port: with the listening port too.
        let has_port = name.rsplit_once(':').is_some_and(|(h, p)| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (!h.contains(':') || h.ends_with(']'))
        });
        if !has_port {
            hosts.push(format!("{name}:{port}"));
        }
        hosts.push(name);
    }
    hosts
}

/// Refuses a request whose `Host` is not one of [`known_hosts`].
async fn known_host(
    axum::extract::State(hosts): axum::extract::State<Arc<Vec<String>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    match host {
        Some(h) if hosts.contains(&h) => next.run(request).await,
        _ => (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard does not answer to that host name (sheaf serve --public-host adds one)",
        )
            .into_response(),
    }
}

/// A failed call's status: the asker's mistake (400, 404, 409), else a
/// shard's (502).
fn status_of(e: &ClientError) -> StatusCode {
    match e {
        ClientError::BadRequest(_) | ClientError::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
        ClientError::UnknownTask { .. }
        | ClientError::UnknownExecution { .. }
        | ClientError::UnknownQueue { .. }
        | ClientError::UnknownSchedule { .. } => StatusCode::NOT_FOUND,
        ClientError::WrongState { .. } | ClientError::Conflict { .. } => StatusCode::CONFLICT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// The tab's icon (browsers ask for `/favicon.ico` whatever the page says).
async fn icon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "max-age=86400"),
        ],
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#1d2430"/><path d="M4 12V4h2v8zm3 0V6h2v6zm3 0V3h2v9z" fill="#cdd6e4"/></svg>"##,
    )
        .into_response()
}

/// A time as the pages show it (UTC, to the millisecond: events of one
/// run are often within a second of each other).
fn time(at: SystemTime) -> String {
    if at < std::time::UNIX_EPOCH {
        // humantime writes no such time (it would panic).
        return "before 1970".into();
    }
    humantime::format_rfc3339_millis(at).to_string()
}

/// An age to the second (`3m 12s`).
fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// At most `max` characters of user data (payloads, errors) on a page.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}… ({} bytes in all)", &text[..at], text.len()),
    }
}

/// Stored text shown whole in a `<pre>`: line breaks and tabs kept, every
/// other control or format character (ESC, CR, a bidi override, a
/// zero-width space) written visibly as `\u{1b}`, so what a task's failing
/// code wrote can neither hide nor reorder the text around it.
fn inert(text: &str) -> String {
    use std::fmt::Write;
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => shown.push(c),
            c if c.is_control() || c.general_category() == GeneralCategory::Format => {
                let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    shown
}

/// A listing's error for the page: a refusal of what was asked (a bad
/// filter or cursor) says what was wrong; anything else says the read failed.
fn read_error(e: &ClientError) -> String {
    cut(&e.to_string(), 300)
}

/// [`read_error`], naming the query parameter `param` when the error is a
/// refusal of what was asked (its status a 400) and `param` was given.
fn read_error_of(e: &ClientError, param: &str, given: &str) -> String {
    if status_of(e) == StatusCode::BAD_REQUEST && !given.is_empty() {
        format!("{param}: {}", read_error(e))
    } else {
        read_error(e)
    }
}

/// The longest query parameter value a page reads (a cursor, a filter).
const MAX_PARAM: usize = 1024;

/// Refuses (400, naming the parameter) a query whose names or values hold
/// a control character or run past [`MAX_PARAM`] bytes: no name the shards
/// keep may hold one, and a NUL the shards refuse outright would otherwise
/// read as a shard that did not answer.
async fn plain_query(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let raw = request.uri().query().unwrap_or("");
    for (k, v) in pairs(raw) {
        let why = if k.chars().chain(v.chars()).any(char::is_control) {
            "holds a control character"
        } else if k.len() > MAX_PARAM || v.len() > MAX_PARAM {
            "is too long (at most 1024 bytes)"
        } else {
            continue;
        };
        return (
            StatusCode::BAD_REQUEST,
            [(
                header::HeaderName::from_static("x-content-type-options"),
                "nosniff",
            )],
            format!("{}: the query parameter {why}", sheaf_core::excerpt::quoted(&k)),
        )
            .into_response();
    }
    next.run(request).await
}

/// The pairs of a query string or form body (`a=1&a=2` keeps both).
pub(crate) fn pairs(raw: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.as_bytes()).into_owned().collect()
}

/// The first value of `key` in `pairs`, or "".
fn first<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

/// The most rows a fleet-wide list page shows (schedules, rate limits,
/// workers): the rest are counted, and a name filter narrows the list.
const LISTED: usize = 500;

/// Every shard's items of `report` that `keep` keeps, by name and shard:
/// the first [`LISTED`] of them, and how many more there were. The shards
/// that did not answer go to the banner.
fn listed<T>(
    chrome: &mut Chrome,
    report: FleetReport<Vec<T>>,
    name: impl Fn(&T) -> &str,
    keep: impl Fn(&T) -> bool,
) -> (Vec<(ShardId, T)>, usize) {
    chrome.missing(report.failed.keys());
    let mut all: Vec<(ShardId, T)> = report
        .ok
        .into_iter()
        .flat_map(|(shard, items)| items.into_iter().map(move |i| (shard, i)))
        .filter(|(_, i)| keep(i))
        .collect();
    all.sort_by(|a, b| name(&a.1).cmp(name(&b.1)).then(a.0.cmp(&b.0)));
    let more = all.len().saturating_sub(LISTED);
    all.truncate(LISTED);
    (all, more)
}

/// A link to `path` with `query` (empty values left out).
fn link(path: &str, query: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in query {
        if !v.is_empty() {
            s.append_pair(k, v);
        }
    }
    let q = s.finish();
    if q.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{q}")
    }
}

/// A query or form as a test writes it.
#[cfg(test)]
fn form_of(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_to_the_millisecond_and_never_panic() {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        assert_eq!(time(at), "2025-12-06T05:46:40.123Z");
        let before = std::time::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(time(before), "before 1970");
    }

    #[test]
    fn stored_text_keeps_its_lines_and_shows_what_would_hide() {
        assert_eq!(inert("a\n\tb <c>"), "a\n\tb <c>");
        assert_eq!(inert("x\u{1b}[2Jy\rz"), "x\\u{1b}[2Jy\\u{d}z");
        assert_eq!(
            inert("pay\u{202e}moc.exe\u{200b}"),
            "pay\\u{202e}moc.exe\\u{200b}"
        );
        assert_eq!(inert("é中😀"), "é中😀");
    }

    #[test]
    fn the_dashboard_answers_to_its_own_names_only() {
        let local = known_hosts("127.0.0.1:8080".parse().expect("an address"), &[]);
        assert!(local.contains(&"localhost:8080".to_owned()));
        assert!(local.contains(&"127.0.0.1:8080".to_owned()));
        assert!(local.contains(&"[::1]:8080".to_owned()));
        assert!(!local.iter().any(|h| h.contains("evil")));
        let every = known_hosts(
            "0.0.0.0:80".parse().expect("an address"),
            &["Ops.Example.com".into(), "[fd00::1]".into(), "h:9".into()],
        );
        assert!(every.contains(&"ops.example.com".to_owned()));
        assert!(every.contains(&"ops.example.com:80".to_owned()));
        assert!(every.contains(&"[fd00::1]:80".to_owned()));
        assert!(every.contains(&"h:9".to_owned()) && !every.contains(&"h:9:80".to_owned()));
        assert!(!every.contains(&"0.0.0.0:80".to_owned()));
        let lan = known_hosts("10.0.0.5:8080".parse().expect("an address"), &[]);
        assert_eq!(lan, ["10.0.0.5:8080"]);
    }
}
