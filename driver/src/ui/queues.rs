//! `/queues`: every queue's counts per shard and in total, its depth over
//! the last minutes (sampled here, bounded), and the concurrency keys near
//! their caps.
//!
//! A shard does not count the tasks it finishes (a finished task leaves
//! `tasks`), so the chart shows what the shards do count: ready and running
//! over time; a queue draining shows as a falling line.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio_util::sync::CancellationToken;

use super::{Chrome, Shared, age, render};
use crate::client::{PageStatus, QueueCounts};

/// Samples kept per queue (15 minutes at the default 10 s).
const KEPT: usize = 90;
/// Queues charted (the first by name); the others show counts only.
const MAX_CHARTED: usize = 200;
/// Concurrency keys listed as near their caps.
const NEAR_CAP_ROWS: usize = 25;

#[derive(Clone, Copy)]
struct Point {
    ready: i64,
    running: i64,
}

/// Each charted queue's last [`KEPT`] samples, taken by [`sample`].
#[derive(Default)]
pub(super) struct Depth {
    series: Mutex<BTreeMap<String, VecDeque<Point>>>,
}

impl Depth {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, VecDeque<Point>>> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One complete sample: a point for every queue in it; a queue no
    /// longer listed is forgotten.
    fn record(&self, totals: &[(&str, &QueueCounts)]) {
        let mut series = self.lock();
        series.retain(|q, _| totals.iter().any(|(name, _)| name == q));
        for (name, c) in totals.iter().take(MAX_CHARTED) {
            let s = series.entry((*name).to_owned()).or_default();
            if s.len() == KEPT {
                s.pop_front();
            }
            s.push_back(Point {
                ready: c.ready,
                running: c.running,
            });
        }
    }

    fn chart(&self, queue: &str) -> Option<Chart> {
        self.lock().get(queue).map(Chart::of)
    }
}

/// Samples every queue's depth until `stop`. A partial answer (a shard
/// down) is not recorded: its queues would seem to drop to nothing.
pub(super) async fn sample(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let listing = shared.client.list_queues().await;
        if listing.status == PageStatus::Complete {
            let totals: Vec<(&str, &QueueCounts)> = listing
                .queues
                .iter()
                .map(|q| (q.queue.as_str(), &q.total))
                .collect();
            shared.depth.record(&totals);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(shared.options.sample_every) => {}
        }
    }
}

/// A small line chart of a queue's depth, drawn in SVG coordinates.
struct Chart {
    ready: String,
    running: String,
    max: i64,
    samples: usize,
}

const CHART_W: f64 = 180.0;
const CHART_H: f64 = 36.0;

impl Chart {
    fn of(points: &VecDeque<Point>) -> Chart {
        let max = points
            .iter()
            .map(|p| p.ready.max(p.running))
            .max()
            .unwrap_or(0)
            .max(1);
        let line = |v: fn(&Point) -> i64| {
            let step = CHART_W / (KEPT - 1) as f64;
            // The newest sample is at the right edge.
            let offset = (KEPT - points.len()) as f64 * step;
            points
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let x = offset + i as f64 * step;
                    let y = CHART_H - (v(p) as f64 / max as f64) * (CHART_H - 2.0) - 1.0;
                    format!("{x:.1},{y:.1}")
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        Chart {
            ready: line(|p| p.ready),
            running: line(|p| p.running),
            max,
            samples: points.len(),
        }
    }
}

/// One row of a queue: a shard's counts, or the total (`shard` "all").
struct CountsRow {
    shard: String,
    ready: i64,
    scheduled: i64,
    running: i64,
    waiting: i64,
    paused: i64,
    dead: i64,
    oldest_ready: String,
}

impl CountsRow {
    fn new(shard: String, c: &QueueCounts) -> CountsRow {
        CountsRow {
            shard,
            ready: c.ready,
            scheduled: c.scheduled,
            running: c.running,
            waiting: c.waiting,
            paused: c.paused,
            dead: c.dead,
            oldest_ready: c.oldest_ready_age.map_or_else(|| "-".into(), age),
        }
    }
}

struct QueueRows {
    name: String,
    rows: Vec<CountsRow>,
    chart: Option<Chart>,
}

/// A concurrency key near its cap on one shard.
struct NearCap {
    shard: String,
    key: String,
    cap: i32,
    running: i64,
    ready: i64,
    waiting: i64,
}

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    chrome: Chrome,
    queues: Vec<QueueRows>,
    near_cap: Vec<NearCap>,
    sample_secs: u64,
}

pages!(QueuesPage);

pub(super) async fn page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut chrome = Chrome::new(&shared, &headers, "queues");
    let (listing, keys) = tokio::join!(shared.client.list_queues(), shared.client.concurrency_stats());
    chrome.missing(listing.unavailable_shards.keys());
    chrome.missing(keys.failed.keys());
    let queues = listing
        .queues
        .iter()
        .map(|q| {
            let mut rows: Vec<CountsRow> = q
                .per_shard
                .iter()
                .map(|(shard, c)| CountsRow::new(shard.to_string(), c))
                .collect();
            rows.push(CountsRow::new("all".into(), &q.total));
            QueueRows {
                name: q.queue.clone(),
                rows,
                chart: shared.depth.chart(&q.queue),
            }
        })
        .collect();
    let mut near_cap: Vec<NearCap> = keys
        .ok
        .iter()
        .flat_map(|(shard, stats)| {
            stats.iter().filter_map(move |s| {
                let cap = s.max_running?;
                // At 80% of its cap, or with work waiting for a slot.
                let near = s.waiting > 0 || s.running * 5 >= i64::from(cap) * 4;
                near.then(|| NearCap {
                    shard: shard.to_string(),
                    key: s.concurrency_key.clone(),
                    cap,
                    running: s.running,
                    ready: s.ready,
                    waiting: s.waiting,
                })
            })
        })
        .collect();
    near_cap.sort_by(|a, b| {
        b.waiting
            .cmp(&a.waiting)
            .then((b.running * i64::from(a.cap.max(1))).cmp(&(a.running * i64::from(b.cap.max(1)))))
    });
    near_cap.truncate(NEAR_CAP_ROWS);
    render(
        StatusCode::OK,
        QueuesPage {
            chrome,
            queues,
            near_cap,
            sample_secs: shared.options.sample_every.as_secs(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(ready: i64) -> QueueCounts {
        QueueCounts {
            ready,
            ..QueueCounts::default()
        }
    }

    #[test]
    fn a_series_keeps_its_last_samples_and_forgets_a_gone_queue() {
        let depth = Depth::default();
        for n in 0..(KEPT as i64 + 10) {
            depth.record(&[("a", &counts(n)), ("b", &counts(1))]);
        }
        let series = depth.lock();
        assert_eq!(series["a"].len(), KEPT);
        assert_eq!(series["a"].front().map(|p| p.ready), Some(10));
        drop(series);
        depth.record(&[("a", &counts(0))]);
        assert!(depth.chart("b").is_none(), "b is no longer listed");
        let chart = depth.chart("a").expect("a chart");
        assert_eq!(chart.samples, KEPT);
        assert_eq!(chart.max, KEPT as i64 + 9);
    }

    #[test]
    fn the_newest_sample_is_at_the_right_edge() {
        let depth = Depth::default();
        depth.record(&[("a", &counts(4))]);
        depth.record(&[("a", &counts(2))]);
        let chart = depth.chart("a").expect("a chart");
        let last = chart.ready.split(' ').next_back().expect("a point");
        assert!(last.starts_with("180.0,"), "{last}");
        // The highest sample touches the top (y = 1), half of it the middle.
        assert!(
            chart
                .ready
                .starts_with(&format!("{:.1},1.0", CHART_W - CHART_W / (KEPT - 1) as f64))
        );
    }
}
