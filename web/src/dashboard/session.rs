//! Who may act: the admin token (`UiOptions::admin_token`) is exchanged at
//! `/login` for a session cookie (HttpOnly, SameSite=Strict). An action is a
//! POST from this origin carrying the session's CSRF token; it runs through
//! the session's own client, whose `actor` (`ui:<name>`) is what each
//! shard's audit log records for it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use askama::Template;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::{Chrome, Shared, first, pairs, render};
use sheaf_driver::Client;

const COOKIE: &str = "sheaf_ui";
/// Sessions kept at once; signing in beyond it ends the oldest.
const MAX_SESSIONS: usize = 32;
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// The longest name a session may act as.
const MAX_NAME: usize = 64;

pub(super) struct Session {
    /// `ui:<name>`: the audit log's actor for this session's actions.
    pub actor: String,
    pub csrf: String,
    /// Acts with `actor` set on its connections.
    pub client: Arc<Client>,
    expires: Instant,
}

pub(super) struct Sessions {
    token: Option<String>,
    by_id: Mutex<HashMap<String, Arc<Session>>>,
    /// Wrong sign-ins, per source.
    backoff: Mutex<Backoff>,
}

/// Sources (a v4 address, a v6 address's /64) tracked at most; beyond it
/// the one whose wait ends first is forgotten.
const SOURCES: usize = 4096;
/// The wait after a first wrong sign-in, doubled by each next one.
const FIRST_WAIT: Duration = Duration::from_millis(300);
/// The longest wait.
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// After a wrong sign-in its source waits (300 ms, doubling with each
/// next one up to a minute) before it may try again; a sign-in sooner is
/// refused at once. Nothing is held meanwhile, so guesses from one place
/// do not hold back the operator's sign-in from another.
#[derive(Default)]
struct Backoff {
    /// Per source: wrong sign-ins in a row, and until when it waits.
    by_source: HashMap<IpAddr, (u32, Instant)>,
}

/// A source as the backoff counts it: a v6 address's /64 (one host's
/// whole prefix), else the address.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u128::from(u64::MAX)))),
        },
        v4 => v4,
    }
}

impl Backoff {
    /// How long `ip` must still wait, if it must.
    fn waiting(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        self.by_source
            .get(&source(ip))
            .map(|(_, until)| until.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    fn failed(&mut self, ip: IpAddr, now: Instant) {
        if self.by_source.len() >= SOURCES && !self.by_source.contains_key(&source(ip)) {
            // Forgets those whose wait ended a minute ago (their next miss
            // starts again at 300 ms), else the one whose wait ends first.
            self.by_source
                .retain(|_, (_, until)| now.saturating_duration_since(*until) < LONGEST_WAIT);
            if self.by_source.len() >= SOURCES {
                let first = self
                    .by_source
                    .iter()
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| *k);
                if let Some(k) = first {
                    self.by_source.remove(&k);
                }
            }
        }
        let (misses, until) = self.by_source.entry(source(ip)).or_insert((0, now));
        *misses = misses.saturating_add(1);
        let wait = FIRST_WAIT
            .saturating_mul(1 << (*misses - 1).min(8))
            .min(LONGEST_WAIT);
        *until = now + wait;
    }

    fn succeeded(&mut self, ip: IpAddr) {
        self.by_source.remove(&source(ip));
    }
}

/// Why an action was refused (a 403 page says it).
pub(super) struct Refusal(pub &'static str);

/// 244 random bits (two v4 UUIDs, from the OS's generator).
fn secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Compares without stopping at the first difference, nor at the shorter
/// one's end: the time says nothing of where they differ, nor of the
/// secret's length.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len().max(b.len());
    let differ = (0..n).fold(u8::from(a.len() != b.len()), |d, i| {
        d | (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0))
    });
    differ == 0
}

/// The value of cookie `name` (the session's: [`COOKIE`]).
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A POST from another site's page is refused: its Origin (else Referer)
/// must name this host. Browsers send one of them with every form POST.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let from = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|h| h.to_str().ok());
    match from {
        None => false,
        Some(from) => {
            let rest = from
                .strip_prefix("http://")
                .or_else(|| from.strip_prefix("https://"))
                .unwrap_or("");
            rest.split('/').next() == Some(host)
        }
    }
}

impl Sessions {
    pub fn new(token: Option<String>) -> Sessions {
        Sessions {
            token: token.filter(|t| !t.is_empty()),
            by_id: Mutex::new(HashMap::new()),
            backoff: Mutex::default(),
        }
    }

    /// Whether an admin token is configured.
    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        // A panic while holding it cannot leave the map half-changed.
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The signed-in session of this request, if any.
    pub fn current(&self, headers: &HeaderMap) -> Option<Arc<Session>> {
        let id = cookie(headers, COOKIE)?;
        let mut map = self.lock();
        match map.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                map.remove(id);
                None
            }
            None => None,
        }
    }

    /// The session an action runs in: same origin, signed in, and the
    /// form's CSRF token is the session's.
    pub fn authorize(&self, headers: &HeaderMap, csrf: &str) -> Result<Arc<Session>, Refusal> {
        if !self.enabled() {
            return Err(Refusal(
                "this dashboard is read-only: it was started without an admin token (SHEAF_UI_TOKEN)",
            ));
        }
        if !same_origin(headers) {
            return Err(Refusal("the request did not come from this dashboard's pages"));
        }
        let session = self
            .current(headers)
            .ok_or(Refusal("sign in with the admin token to act"))?;
        if !same(&session.csrf, csrf) {
            return Err(Refusal(
                "the form's token is not this session's: reload the page and try again",
            ));
        }
        Ok(session)
    }

    fn open(&self, base: &Client, name: &str, token: &str) -> Result<(String, Arc<Session>), &'static str> {
        let Some(expected) = &self.token else {
            return Err("this dashboard is read-only: it was started without an admin token");
        };
        if !same(expected, token) {
            return Err("that is not the admin token");
        }
        let name = name.trim();
        if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
            return Err("the name must be 1 to 64 characters, without control characters");
        }
        let actor = format!("ui:{name}");
        let options = base.admin().pools().options().clone().actor(Some(actor.clone()));
        let client = Client::new(base.topology().clone(), options)
            .map_err(|_| "a client for the session could not be made")?;
        let session = Arc::new(Session {
            actor,
            csrf: secret(),
            client: Arc::new(client),
            expires: Instant::now() + SESSION_TTL,
        });
        let id = secret();
        let mut map = self.lock();
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        while map.len() >= MAX_SESSIONS {
            let oldest = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            self.lock().remove(id);
        }
    }

    /// Ends the sessions past their time (and their clients' connections).
    pub fn prune(&self) {
        let now = Instant::now();
        self.lock().retain(|_, s| s.expires > now);
    }
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    chrome: Chrome,
    error: Option<String>,
}

pages!(LoginPage);

pub(super) async fn login_page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let chrome = Chrome::new(&shared, &headers, "sign in");
    render(StatusCode::OK, LoginPage { chrome, error: None })
}

pub(super) async fn login(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = pairs(&String::from_utf8_lossy(&body));
    let backoff = || shared.sessions.backoff.lock().unwrap_or_else(|e| e.into_inner());
    let waiting = backoff().waiting(peer.ip(), Instant::now());
    let (status, refused) = if !same_origin(&headers) {
        (
            StatusCode::FORBIDDEN,
            "the request did not come from this dashboard's pages".to_owned(),
        )
    } else if let Some(wait) = waiting {
        (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "a wrong sign-in came from here lately: try again in {:.1} s",
                wait.as_secs_f64()
            ),
        )
    } else {
        match shared
            .sessions
            .open(&shared.client, first(&form, "name"), first(&form, "token"))
        {
            Ok((id, _)) => {
                backoff().succeeded(peer.ip());
                // A new session, never the one the browser came with.
                shared.sessions.close(&headers);
                let cookie = format!(
                    "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                    SESSION_TTL.as_secs()
                );
                return ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response();
            }
            Err(why) => {
                backoff().failed(peer.ip(), Instant::now());
                (StatusCode::FORBIDDEN, why.to_owned())
            }
        }
    };
    let chrome = Chrome::new(&shared, &headers, "sign in");
    render(
        status,
        LoginPage {
            chrome,
            error: Some(refused),
        },
    )
}

/// Ends the session (with its CSRF token: another site cannot sign one
/// out) and forgets its cookie.
pub(super) async fn logout(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let form = pairs(&String::from_utf8_lossy(&body));
    if let Err(refusal) = shared.sessions.authorize(&headers, first(&form, "csrf")) {
        let chrome = Chrome::new(&shared, &headers, "sign in");
        return render(
            StatusCode::FORBIDDEN,
            LoginPage {
                chrome,
                error: Some(refusal.0.to_owned()),
            },
        );
    }
    shared.sessions.close(&headers);
    let expired = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, expired)], Redirect::to("/")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), v.parse().expect("a header value"));
        }
        h
    }

    #[test]
    fn an_action_must_come_from_this_host() {
        let host = (header::HOST, "127.0.0.1:8080");
        assert!(same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://127.0.0.1:8080")
        ])));
        assert!(same_origin(&headers(&[
            host.clone(),
            (header::REFERER, "http://127.0.0.1:8080/confirm?x=1")
        ])));
        assert!(!same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            host.clone(),
            (header::ORIGIN, "http://127.0.0.1:8080.evil.example")
        ])));
        assert!(!same_origin(&headers(&[host.clone(), (header::ORIGIN, "null")])));
        assert!(!same_origin(&headers(&[host])), "neither Origin nor Referer");
    }

    #[test]
    fn a_wrong_sign_in_holds_back_its_own_source_only() {
        let mut b = Backoff::default();
        let now = Instant::now();
        let guesser: IpAddr = "10.0.0.9".parse().expect("an address");
        let operator: IpAddr = "10.0.0.1".parse().expect("an address");
        b.failed(guesser, now);
        assert_eq!(b.waiting(guesser, now), Some(FIRST_WAIT));
        assert_eq!(b.waiting(operator, now), None, "another source waits for nothing");
        assert_eq!(b.waiting(guesser, now + FIRST_WAIT), None, "and it ends");
        for _ in 0..20 {
            b.failed(guesser, now);
        }
        assert_eq!(b.waiting(guesser, now), Some(LONGEST_WAIT), "doubling, to a cap");
        b.succeeded(guesser);
        assert_eq!(b.waiting(guesser, now), None);
        // A v6 host's whole /64 is one source.
        let a: IpAddr = "fd00::1:2".parse().expect("an address");
        let same_64: IpAddr = "fd00::9:9".parse().expect("an address");
        let other_64: IpAddr = "fd00:0:0:1::1".parse().expect("an address");
        b.failed(a, now);
        assert!(b.waiting(same_64, now).is_some() && b.waiting(other_64, now).is_none());
        // Bounded: many sources forget the one whose wait ends first.
        for n in 0..SOURCES as u32 + 10 {
            let at = now + Duration::from_millis(u64::from(n));
            b.failed(IpAddr::V4(std::net::Ipv4Addr::from(n)), at);
        }
        assert_eq!(b.by_source.len(), SOURCES);
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[(header::COOKIE, "a=1; sheaf_ui=abc; b=2")]);
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&headers(&[(header::COOKIE, "sheaf_uix=1")]), COOKIE), None);
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
        assert!(!same("ab", "abc") && !same("", "a") && same("", ""));
        assert!(!same("ab\0", "ab"), "a NUL does not pad a shorter one to equal");
    }
}
