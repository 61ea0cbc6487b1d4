//! `/queues`: every queue's counts per shard and in total with its depth
//! over the last minutes, the fleet's throughput over the same minutes,
//! and the concurrency keys near their caps. Both charts are sampled here
//! (bounded: [`KEPT`] samples).
//!
//! A shard keeps no count of the tasks it finished (a finished task leaves
//! `tasks`, and counting on the hot path would cost every completion), so
//! throughput is read from PostgreSQL's own statistics: the rows deleted
//! from `sheaf.tasks` (completed, dead-lettered, cancelled, moved away) per
//! second, per shard. Per queue, the chart shows depth: ready and running.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tokio_util::sync::CancellationToken;

use super::{Chrome, Shared, age, render};
use sheaf_driver::ShardId;
use sheaf_driver::{PageStatus, QueueCounts};

/// Samples kept per queue (15 minutes at the default 10 s).
const KEPT: usize = 90;
/// Queues charted at most (90 samples of two numbers each: 1.4 KB a
/// queue): those with the most unfinished work; an idle queue is charted
/// only while it keeps a series from its busy time.
const MAX_CHARTED: usize = 1000;
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

    /// One complete sample: a point for every charted queue. A queue is
    /// charted once it has unfinished work, while it is among the
    /// [`MAX_CHARTED`] with the most; one no longer listed is forgotten.
    fn record(&self, totals: &[(&str, &QueueCounts)]) {
        let work = |c: &QueueCounts| c.ready + c.scheduled + c.running + c.waiting + c.paused;
        let mut series = self.lock();
        let mut charted: Vec<&(&str, &QueueCounts)> = totals
            .iter()
            .filter(|(name, c)| work(c) > 0 || series.contains_key(*name))
            .collect();
        charted.sort_by_key(|(name, c)| (std::cmp::Reverse(work(c)), *name));
        charted.truncate(MAX_CHARTED);
        series.retain(|q, _| charted.iter().any(|(name, _)| name == q));
        for (name, c) in charted {
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

    /// `queue`'s chart, its samples taken `every` apart.
    fn chart(&self, queue: &str, every: Duration) -> Option<Plot> {
        self.lock().get(queue).map(|points| Plot::depth(points, every))
    }
}

/// The fleet's tasks finished per second, from `Admin::tasks_deleted` samples.
#[derive(Default)]
pub(super) struct Throughput {
    ticks: Mutex<VecDeque<(Instant, BTreeMap<ShardId, i64>)>>,
}

impl Throughput {
    fn record(&self, at: Instant, counts: BTreeMap<ShardId, i64>) {
        let mut ticks = self.ticks.lock().unwrap_or_else(|e| e.into_inner());
        if ticks.len() == KEPT + 1 {
            ticks.pop_front();
        }
        ticks.push_back((at, counts));
    }

    /// Per interval between two samples: the fleet's rate and each
    /// shard's. A shard missing from either sample, or whose statistics
    /// were reset in between, counts nothing for it.
    fn rates(&self) -> Vec<(f64, BTreeMap<ShardId, f64>)> {
        let ticks = self.ticks.lock().unwrap_or_else(|e| e.into_inner());
        ticks
            .iter()
            .zip(ticks.iter().skip(1))
            .map(|((t0, before), (t1, after))| {
                let secs = t1.duration_since(*t0).as_secs_f64().max(0.001);
                let per_shard: BTreeMap<ShardId, f64> = after
                    .iter()
                    .filter_map(|(s, n)| {
                        let was = before.get(s)?;
                        (n >= was).then(|| (*s, (n - was) as f64 / secs))
                    })
                    .collect();
                (per_shard.values().sum(), per_shard)
            })
            .collect()
    }
}

/// Samples every queue's depth until `stop`. A partial answer (a shard
/// down) is not recorded: its queues would seem to drop to nothing.
pub(super) async fn sample(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let (listing, finished) = tokio::join!(
            shared.client.admin().list_queues(),
            shared.client.admin().tasks_deleted()
        );
        shared.throughput.record(Instant::now(), finished.ok);
        shared.sessions.prune();
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

/// A line chart with its axes, as `chart.html` draws it: a title naming
/// the unit, the value axis from 0 to the highest point, the time axis from
/// the oldest sample kept to now (the newest sample at the right edge).
struct Plot {
    title: &'static str,
    /// The value axis's top label (its highest point).
    max: String,
    /// Each line: its colour and its points.
    lines: Vec<(&'static str, String)>,
    /// The time axis's labels: where (x), anchored how, and the time.
    ticks: Vec<(String, &'static str, String)>,
    samples: usize,
}

/// The chart's frame in SVG units (`chart.html` draws the same): the plot
/// area is `PLOT_W` × `PLOT_H` at (`LEFT`, `TOP`), the value labels left
/// of it, the time labels under it.
const LEFT: f64 = 44.0;
const TOP: f64 = 16.0;
const PLOT_W: f64 = 248.0;
const PLOT_H: f64 = 48.0;

impl Plot {
    /// A queue's depth: ready and running.
    fn depth(points: &VecDeque<Point>, every: Duration) -> Plot {
        let max = points
            .iter()
            .map(|p| p.ready.max(p.running))
            .max()
            .unwrap_or(0)
            .max(1);
        Plot {
            title: "ready and running tasks",
            max: max.to_string(),
            lines: vec![
                (READY, polyline(points.iter().map(|p| p.ready as f64), max as f64)),
                (
                    RUNNING,
                    polyline(points.iter().map(|p| p.running as f64), max as f64),
                ),
            ],
            ticks: ticks(every),
            samples: points.len(),
        }
    }
}

const READY: &str = "#1f6feb";
const RUNNING: &str = "#18794e";

/// The time axis's labels: the oldest kept sample's age, half of it, now.
fn ticks(every: Duration) -> Vec<(String, &'static str, String)> {
    let span = every * (KEPT - 1) as u32;
    vec![
        (format!("{LEFT:.1}"), "start", format!("-{}", age(span))),
        (
            format!("{:.1}", LEFT + PLOT_W / 2.0),
            "middle",
            format!("-{}", age(span / 2)),
        ),
        (format!("{:.1}", LEFT + PLOT_W), "end", "now".into()),
    ]
}

/// The points of a chart's line: the newest value at the right edge, `max`
/// at the top of the plot area, 0 at its bottom.
fn polyline(values: impl ExactSizeIterator<Item = f64>, max: f64) -> String {
    let step = PLOT_W / (KEPT - 1) as f64;
    let offset = KEPT.saturating_sub(values.len()) as f64 * step;
    values
        .enumerate()
        .map(|(i, v)| {
            let x = LEFT + offset + i as f64 * step;
            let y = TOP + PLOT_H - (v / max) * PLOT_H;
            format!("{x:.1},{y:.1}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The fleet's throughput chart and each shard's latest rate.
struct Rates {
    plot: Plot,
    now: String,
    per_shard: Vec<(String, String)>,
    /// Readable shards the latest interval has no count of.
    missing: Vec<String>,
}

impl Rates {
    fn of(rates: &[(f64, BTreeMap<ShardId, f64>)], readable: &[ShardId], every: Duration) -> Option<Rates> {
        let (now, latest) = rates.last()?;
        let missing = readable
            .iter()
            .filter(|s| !latest.contains_key(s))
            .map(ToString::to_string)
            .collect();
        let max = rates.iter().map(|(r, _)| *r).fold(0.0, f64::max).max(1.0);
        Some(Rates {
            plot: Plot {
                title: "tasks finished per second",
                max: format!("{max:.1}"),
                lines: vec![("#8250df", polyline(rates.iter().map(|(r, _)| *r), max))],
                ticks: ticks(every),
                samples: rates.len(),
            },
            now: format!("{now:.1}"),
            per_shard: latest
                .iter()
                .map(|(s, r)| (s.to_string(), format!("{r:.1}")))
                .collect(),
            missing,
        })
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
    chart: Option<Plot>,
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
    throughput: Option<Rates>,
}

pages!(QueuesPage);

pub(super) async fn page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut chrome = Chrome::new(&shared, &headers, "queues");
    chrome.refreshing(shared.options.refresh_every, &headers, "/queues", None);
    let (listing, keys) = tokio::join!(
        shared.client.admin().list_queues(),
        shared.client.admin().concurrency_stats()
    );
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
                chart: shared.depth.chart(&q.queue, shared.options.sample_every),
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
            throughput: Rates::of(
                &shared.throughput.rates(),
                &shared.client.readable_shards(),
                shared.options.sample_every,
            ),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_secs(10);

    /// The chart alone, as the queues page includes it.
    #[derive(Template)]
    #[template(source = "{% include \"chart.html\" %}", ext = "html")]
    struct ChartSvg<'a> {
        plot: &'a Plot,
    }

    fn counts(ready: i64) -> QueueCounts {
        let mut counts = QueueCounts::default();
        counts.ready = ready;
        counts
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
        assert!(depth.chart("b", EVERY).is_none(), "b is no longer listed");
        let chart = depth.chart("a", EVERY).expect("a chart");
        assert_eq!(chart.samples, KEPT);
        assert_eq!(chart.max, (KEPT as i64 + 9).to_string());
        depth.record(&[("a", &counts(0)), ("idle", &counts(0))]);
        assert!(depth.chart("idle", EVERY).is_none(), "never busy: not charted");
        assert!(depth.chart("a", EVERY).is_some(), "drained: still charted");
    }

    #[test]
    fn throughput_is_the_growth_of_each_shards_count_per_second() {
        let t = Throughput::default();
        let (a, b) = (ShardId::new(0).expect("an id"), ShardId::new(1).expect("an id"));
        let t0 = Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        t.record(at(0), BTreeMap::from([(a, 100), (b, 50)]));
        t.record(at(10), BTreeMap::from([(a, 200), (b, 70)]));
        // b's statistics were reset; a's shard did not answer.
        t.record(at(20), BTreeMap::from([(b, 5)]));
        t.record(at(30), BTreeMap::from([(a, 300), (b, 25)]));
        let rates = t.rates();
        assert_eq!(rates.len(), 3);
        assert_eq!(rates[0].0, 12.0);
        assert_eq!(rates[0].1[&a], 10.0);
        assert_eq!(rates[1].0, 0.0, "a reset or a missing shard counts nothing");
        assert_eq!(rates[2].0, 2.0, "b alone: a was missing from the sample before");
        for n in 0..(KEPT as u64 + 5) {
            t.record(at(40 + n), BTreeMap::from([(a, 300)]));
        }
        assert_eq!(t.rates().len(), KEPT, "bounded");
    }

    #[test]
    fn the_newest_sample_is_at_the_right_edge() {
        let depth = Depth::default();
        depth.record(&[("a", &counts(4))]);
        depth.record(&[("a", &counts(2))]);
        let chart = depth.chart("a", EVERY).expect("a chart");
        let ready = &chart.lines[0].1;
        let last = ready.split(' ').next_back().expect("a point");
        assert!(last.starts_with("292.0,"), "{last}");
        // The highest sample touches the top, half of it the middle.
        assert!(ready.starts_with(&format!("{:.1},16.0", LEFT + PLOT_W - PLOT_W / (KEPT - 1) as f64)));
        assert!(last.ends_with(",40.0"), "{last}");
    }

    #[test]
    fn a_chart_has_its_axes_labelled() {
        let depth = Depth::default();
        depth.record(&[("a", &counts(7))]);
        let plot = depth.chart("a", EVERY).expect("a chart");
        let labels: Vec<&str> = plot.ticks.iter().map(|(_, _, l)| l.as_str()).collect();
        assert_eq!(labels, ["-14m 50s", "-7m 25s", "now"]);
        let svg = ChartSvg { plot: &plot }.render().expect("rendered");
        for text in [">ready and running tasks<", ">7<", ">0<", ">-14m 50s<", ">now<"] {
            assert!(svg.contains(text), "{text} in {svg}");
        }
    }
}
