//! Who may act: the admin token (`UiOptions::admin_token`) is exchanged at
//! `/login` for a session cookie (HttpOnly, SameSite=Strict). An action is a
//! POST from this origin carrying the session's CSRF token; it runs through
//! the session's own client, whose `actor` (`ui:<name>`) is what each
//! shard's audit log records for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use askama::Template;
use axum::body::Bytes;
use axum::extract::State;
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
    /// One sign-in at a time, a failed one held 300 ms: guesses run at 3 a
    /// second however many are sent at once.
    signing_in: tokio::sync::Mutex<()>,
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

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
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
            signing_in: tokio::sync::Mutex::new(()),
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
        let id = cookie(headers)?;
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
        if let Some(id) = cookie(headers) {
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
    error: Option<&'static str>,
}

pages!(LoginPage);

pub(super) async fn login_page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let chrome = Chrome::new(&shared, &headers, "sign in");
    render(StatusCode::OK, LoginPage { chrome, error: None })
}

pub(super) async fn login(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let form = pairs(&String::from_utf8_lossy(&body));
    let refused = if same_origin(&headers) {
        let _one_at_a_time = shared.sessions.signing_in.lock().await;
        match shared
            .sessions
            .open(&shared.client, first(&form, "name"), first(&form, "token"))
        {
            Ok((id, _)) => {
                // A new session, never the one the browser came with.
                shared.sessions.close(&headers);
                let cookie = format!(
                    "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                    SESSION_TTL.as_secs()
                );
                return ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response();
            }
            Err(why) => {
                // A wrong guess costs time, and holds the next one back.
                tokio::time::sleep(Duration::from_millis(300)).await;
                why
            }
        }
    } else {
        "the request did not come from this dashboard's pages"
    };
    let chrome = Chrome::new(&shared, &headers, "sign in");
    render(
        StatusCode::FORBIDDEN,
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
                error: Some(refusal.0),
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
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[(header::COOKIE, "a=1; sheaf_ui=abc; b=2")]);
        assert_eq!(cookie(&h), Some("abc"));
        assert_eq!(cookie(&headers(&[(header::COOKIE, "sheaf_uix=1")])), None);
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
        assert!(!same("ab", "abc") && !same("", "a") && same("", ""));
        assert!(!same("ab\0", "ab"), "a NUL does not pad a shorter one to equal");
    }
}
