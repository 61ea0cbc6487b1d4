//! Queue statistics.

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::errors::SpiResultExt;
use crate::queue;
use crate::workers::LIVE_SECS;

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
    let name = queue::check_name(queue);
    let row = Spi::connect(|client| {
        let table = client
            .select(
                "SELECT (SELECT count(*) FROM ready WHERE queue = $1), \
                        count(*) FILTER (WHERE state = 'scheduled'), \
                        count(*) FILTER (WHERE state = 'running'), \
                        count(*) FILTER (WHERE state = 'waiting'), \
                        (SELECT count(*) FROM dead_letters WHERE queue = $1), \
                        (SELECT count(*) FROM workers WHERE $1 = ANY(queues) \
                            AND last_seen_at > now() - make_interval(secs => $2)), \
                        now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id \
                                 WHERE r.queue = $1) \
                 FROM tasks WHERE queue = $1",
                None,
                &[name.into(), (LIVE_SECS as f64).into()],
            )
            .or_internal("reading queue stats");
        let row = table.first();
        let n = |i: usize| row.get::<i64>(i).or_internal("reading queue stats").unwrap_or(0);
        (
            n(1),
            n(2),
            n(3),
            n(4),
            n(5),
            n(6),
            row.get::<Interval>(7).or_internal("reading queue stats"),
        )
    });
    TableIterator::new(vec![row])
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
    let rows = Spi::connect(|client| {
        client
            .select(
                "SELECT q.name, \
                        (SELECT count(*) FROM ready r WHERE r.queue = q.name), \
                        now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id \
                                 WHERE r.queue = q.name) \
                 FROM queues q \
                 WHERE EXISTS (SELECT 1 FROM ready r WHERE r.queue = q.name) \
                   AND NOT EXISTS (SELECT 1 FROM workers w WHERE q.name = ANY(w.queues) \
                                   AND w.last_seen_at > now() - make_interval(secs => $1)) \
                 ORDER BY q.name",
                None,
                &[(LIVE_SECS as f64).into()],
            )
            .or_internal("reading stranded work")
            .map(|row| {
                let read = || -> Result<_, pgrx::spi::SpiError> {
                    Ok((
                        row.get::<String>(1)?.unwrap_or_default(),
                        row.get::<i64>(2)?.unwrap_or(0),
                        row.get::<Interval>(3)?,
                    ))
                };
                read().or_internal("reading stranded work")
            })
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}
