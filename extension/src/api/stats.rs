//! Queue statistics: one queue by state, and work no live worker serves.

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::queue::{queues, stats};

/// One queue's tasks by state, its dead letters, its live workers, and the
/// age of its oldest ready task. Counts scan the queue's rows: an operator
/// view, not a hot path.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn queue_stats(
    queue: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(ready, i64),
        name!(scheduled, i64),
        name!(running, i64),
        name!(waiting, i64),
        name!(dead, i64),
        name!(live_workers, i64),
        name!(oldest_ready_age, Option<Interval>),
    ),
> {
    let name = queues::check_name(queue);
    let c = stats::queue(name);
    TableIterator::once((
        c.ready,
        c.scheduled,
        c.running,
        c.waiting,
        c.dead,
        c.live_workers,
        c.oldest_ready_age,
    ))
}

/// Claimable work nobody is claiming: each queue with ready tasks and no
/// live worker (see `live_workers`) serving it, with its ready count and the
/// age of its oldest ready task. Walks the queue list and seeks each queue's
/// ready rows, so its cost follows the queues and the stranded rows only.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn stranded_work() -> TableIterator<
    'static,
    (
        name!(queue, String),
        name!(ready, i64),
        name!(oldest_ready_age, Option<Interval>),
    ),
> {
    TableIterator::new(
        stats::stranded()
            .into_iter()
            .map(|s| (s.queue, s.ready, s.oldest_ready_age)),
    )
}
