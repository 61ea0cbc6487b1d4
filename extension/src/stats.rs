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
