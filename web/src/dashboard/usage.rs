//! `/usage`: the usage report (`Admin::usage_report`) for a chosen window
//! and grouping, merged across shards.
//!
//! A complete report is kept a while ([`Kept`]): over a long window it
//! costs the shards seconds (ui-bench: 0.7 s for 7 days, 2.6 s for 30 at
//! 250K runs a shard), and a minute changes little of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, cut, first, pairs, read_error, render, status_of, time};
use sheaf_driver::{GroupBy, Usage};

/// The windows offered, ending now.
const WINDOWS: [(&str, u64); 4] = [
    ("1h", 3600),
    ("24h", 86_400),
    ("7d", 7 * 86_400),
    ("30d", 30 * 86_400),
];

/// Reports kept, at most.
const KEPT_REPORTS: usize = 32;
/// Requests for a report not kept that may wait for one at once (one
/// computing, the rest in line): a page asked for beyond it is a 503, so
/// a run of new `attr` values cannot pile up reports for the shards.
const WAITING: usize = 4;
/// The longest search attribute a report may be grouped by.
const MAX_ATTR: usize = 128;

/// How long a window's report is kept: a 1440th of the window, from 5 s
/// (the last hour) to 5 minutes (a week or more).
fn keep_for(window: Duration) -> Duration {
    (window / 1440).clamp(Duration::from_secs(5), Duration::from_secs(300))
}

/// A report's (window, attribute).
type Key = (String, String);

/// The complete reports lately computed, each kept until its instant.
pub(super) struct Kept {
    reports: Mutex<HashMap<Key, (Instant, Arc<Computed>)>>,
    /// One report computed at a time: the same one asked for twice at once
    /// is computed once, and the shards never run many.
    computing: tokio::sync::Mutex<()>,
    /// [`WAITING`] places in line for `computing`.
    waiting: tokio::sync::Semaphore,
}

impl Default for Kept {
    fn default() -> Self {
        Kept {
            reports: Mutex::default(),
            computing: tokio::sync::Mutex::default(),
            waiting: tokio::sync::Semaphore::new(WAITING),
        }
    }
}

struct Computed {
    rows: Vec<UsageRow>,
    at: SystemTime,
}

impl Kept {
    fn get(&self, key: &Key) -> Option<Arc<Computed>> {
        let reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        reports
            .get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, c)| c.clone())
    }

    fn put(&self, key: Key, until: Instant, computed: Arc<Computed>) {
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        reports.retain(|_, (u, _)| *u > now);
        let full = reports.len() >= KEPT_REPORTS;
        if let Some(k) = reports
            .iter()
            .min_by_key(|(_, (u, _))| *u)
            .map(|(k, _)| k.clone())
            .filter(|_| full)
        {
            reports.remove(&k);
        }
        reports.insert(key, (until, computed));
    }
}

#[derive(Clone)]
struct UsageRow {
    group: String,
    starts: i64,
    completed: i64,
    failed: i64,
    cancelled: i64,
    timed_out: i64,
    activities: i64,
    activities_failed: i64,
    compute: String,
    metered: String,
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    chrome: Chrome,
    window: String,
    windows: Vec<&'static str>,
    attr: String,
    error: Option<String>,
    rows: Vec<UsageRow>,
    /// When the report shown was computed.
    computed_at: String,
    kept_secs: u64,
}

pages!(UsagePage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let chosen = first(&q, "window");
    let found = WINDOWS.iter().find(|(w, _)| *w == chosen).copied();
    let (window, secs) = found.unwrap_or(WINDOWS[1]);
    let mut page = UsagePage {
        chrome: Chrome::new(&shared, &headers, "usage"),
        window: window.to_owned(),
        windows: WINDOWS.iter().map(|(w, _)| *w).collect(),
        attr: first(&q, "attr").trim().to_owned(),
        error: None,
        rows: Vec::new(),
        computed_at: String::new(),
        kept_secs: 0,
    };
    if found.is_none() && !chosen.is_empty() {
        page.error = Some(format!(
            "window: expected one of 1h, 24h, 7d, 30d, got {}",
            sheaf_core::excerpt::quoted(chosen)
        ));
        return render(StatusCode::BAD_REQUEST, page);
    }
    if !page.attr.is_empty() && !page.chrome.payloads {
        // The groups would be the attribute's values.
        page.error = Some("attr: grouping by a search attribute needs a signed-in session".into());
        return render(StatusCode::FORBIDDEN, page);
    }
    if page.attr.len() > MAX_ATTR {
        page.error = Some(format!(
            "attr: a search attribute is at most {MAX_ATTR} bytes, got {}",
            page.attr.len()
        ));
        page.attr = cut(&page.attr, 40);
        return render(StatusCode::BAD_REQUEST, page);
    }
    let window = Duration::from_secs(secs);
    page.kept_secs = keep_for(window).as_secs();
    let key = (page.window.clone(), page.attr.clone());
    if let Some(kept) = shared.usage.get(&key) {
        return kept_page(page, &kept);
    }
    let Ok(_in_line) = shared.usage.waiting.try_acquire() else {
        page.error = Some(format!(
            "{WAITING} usage reports are being computed or waited for: try again in a moment \
             (the reports already computed are served at once)"
        ));
        return render(StatusCode::SERVICE_UNAVAILABLE, page);
    };
    let _one_at_a_time = shared.usage.computing.lock().await;
    if let Some(kept) = shared.usage.get(&key) {
        return kept_page(page, &kept);
    }
    let group = if page.attr.is_empty() {
        GroupBy::WorkflowName
    } else {
        GroupBy::SearchAttr(page.attr.clone())
    };
    let to = SystemTime::now();
    match shared.client.admin().usage_report(to - window, to, &group).await {
        Err(e) => {
            page.error = Some(read_error(&e));
            page.chrome.failed(&e);
            render(status_of(&e), page)
        }
        Ok(report) => {
            page.chrome.missing(report.unavailable_shards.keys());
            page.rows = report.groups.iter().map(|(g, u)| UsageRow::of(g, u)).collect();
            page.computed_at = time(to);
            if report.unavailable_shards.is_empty() {
                let computed = Arc::new(Computed {
                    rows: page.rows.clone(),
                    at: to,
                });
                shared.usage.put(key, Instant::now() + keep_for(window), computed);
            }
            render(StatusCode::OK, page)
        }
    }
}

/// The page of a kept report.
fn kept_page(mut page: UsagePage, kept: &Computed) -> Response {
    page.rows = kept.rows.clone();
    page.computed_at = time(kept.at);
    render(StatusCode::OK, page)
}

impl UsageRow {
    fn of(group: &str, u: &Usage) -> UsageRow {
        UsageRow {
            group: cut(group, 200),
            starts: u.workflow_starts,
            completed: u.completed,
            failed: u.failed,
            cancelled: u.cancelled,
            timed_out: u.timed_out,
            activities: u.activity_executions,
            activities_failed: u.activity_executions_failed,
            compute: format!("{:.1}", u.activity_compute_seconds),
            metered: cut(
                &u.metered
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                300,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_kept_for_a_share_of_its_window_and_then_forgotten() {
        assert_eq!(keep_for(Duration::from_secs(3600)), Duration::from_secs(5));
        assert_eq!(keep_for(Duration::from_secs(86_400)), Duration::from_secs(60));
        assert_eq!(
            keep_for(Duration::from_secs(30 * 86_400)),
            Duration::from_secs(300)
        );
        let kept = Kept::default();
        let key = ("1h".to_owned(), String::new());
        let computed = Arc::new(Computed {
            rows: Vec::new(),
            at: SystemTime::now(),
        });
        kept.put(
            key.clone(),
            Instant::now() + Duration::from_secs(60),
            computed.clone(),
        );
        assert!(kept.get(&key).is_some());
        kept.put(key.clone(), Instant::now(), computed);
        assert!(kept.get(&key).is_none(), "expired");
        for n in 0..(KEPT_REPORTS + 5) {
            kept.put(
                (n.to_string(), String::new()),
                Instant::now() + Duration::from_secs(60 + n as u64),
                Arc::new(Computed {
                    rows: Vec::new(),
                    at: SystemTime::now(),
                }),
            );
        }
        assert_eq!(
            kept.reports.lock().expect("a lock").len(),
            KEPT_REPORTS,
            "bounded"
        );
        assert!(
            kept.get(&("0".to_owned(), String::new())).is_none(),
            "the soonest to expire went"
        );
        let in_line: Vec<_> = (0..WAITING)
            .map(|_| kept.waiting.try_acquire().expect("a place in line"))
            .collect();
        assert!(kept.waiting.try_acquire().is_err(), "the line is bounded");
        drop(in_line);
        assert!(kept.waiting.try_acquire().is_ok(), "and its places come back");
    }
}
