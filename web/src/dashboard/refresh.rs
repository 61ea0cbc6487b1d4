//! Auto-refresh without script: a list page (fleet, queues, executions,
//! tasks, dead letters) reloads itself every [`UiOptions::refresh_every`]
//! (default [`EVERY`] seconds) with a `<meta http-equiv="refresh">`,
//! unless the operator turned it off. The
//! switch is a link to `/refresh`, which keeps the choice in a cookie
//! (`sheaf_refresh=off`, this browser only) and goes back to the page. A
//! confirmation, the sign-in page and the execution page (its action forms)
//! never reload: what is typed there would be lost.

use std::time::Duration;

use axum::extract::RawQuery;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::session::cookie;
use super::{MAX_PARAM, first, link, pairs};

/// Seconds between reloads by default.
pub(super) const EVERY: u64 = 10;
const COOKIE: &str = "sheaf_refresh";

/// A list page's refresh: whether it reloads, and the link that flips it.
pub(super) struct Refresh {
    pub on: bool,
    pub every: u64,
    pub toggle: String,
}

impl Refresh {
    /// The refresh of the page at `path` with query `raw`, as this
    /// browser chose it; `None` if the dashboard never reloads pages.
    pub(super) fn of(every: Duration, headers: &HeaderMap, path: &str, raw: Option<&str>) -> Option<Refresh> {
        if every.as_secs() == 0 {
            return None;
        }
        let on = cookie(headers, COOKIE) != Some("off");
        let here = match raw {
            Some(q) if !q.is_empty() && path.len() + q.len() < MAX_PARAM => format!("{path}?{q}"),
            _ => path.to_owned(),
        };
        Some(Refresh {
            on,
            every: every.as_secs(),
            toggle: link(
                "/refresh",
                &[("to", if on { "off" } else { "on" }), ("back", &here)],
            ),
        })
    }
}

/// `/refresh?to=on|off&back=PATH`: keeps the choice and goes back to
/// `PATH` (a path of this dashboard; anything else goes to the fleet page).
pub(super) async fn switch(RawQuery(raw): RawQuery) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let cookie = match first(&q, "to") {
        "off" => format!("{COOKIE}=off; HttpOnly; SameSite=Strict; Path=/; Max-Age=31536000"),
        _ => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    };
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to(local(first(&q, "back"))),
    )
        .into_response()
}

/// `back` if it is a path of this dashboard (`/…`, not `//host` nor
/// `/\host`, which browsers read as another site), else `/`.
fn local(back: &str) -> &str {
    let ours = back.starts_with('/')
        && !back.starts_with("//")
        && !back.starts_with("/\\")
        && back.bytes().all(|b| b.is_ascii_graphic());
    if ours { back } else { "/" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_goes_back_only_to_a_page_of_its_own() {
        assert_eq!(local("/tasks?queue=a%20b"), "/tasks?queue=a%20b");
        assert_eq!(local("//evil.example/"), "/");
        assert_eq!(local("/\\evil.example"), "/");
        assert_eq!(local("https://evil.example/"), "/");
        assert_eq!(local("/a b"), "/");
        assert_eq!(local(""), "/");
    }

    #[test]
    fn the_switch_flips_and_comes_back_here() {
        let every = Duration::from_secs(EVERY);
        let on = Refresh::of(every, &HeaderMap::new(), "/tasks", Some("queue=q")).expect("on");
        assert!(on.on);
        assert_eq!(on.toggle, "/refresh?to=off&back=%2Ftasks%3Fqueue%3Dq");
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; sheaf_refresh=off".parse().expect("a header"),
        );
        let off = Refresh::of(every, &h, "/", None).expect("switched off");
        assert!(!off.on);
        assert_eq!(off.toggle, "/refresh?to=on&back=%2F");
        assert!(Refresh::of(Duration::ZERO, &h, "/", None).is_none(), "never");
    }
}
