//! Rate limits, start throttles' pacing overrides, and their listing.
//! Every change writes the audit log.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::options::MAX_KEY_BYTES;
use sheaf_core::rate::Pace;

use crate::base::args::{self, delay_secs, required};
use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::base::{audit, clock};
use crate::queue::rate;
use crate::workflow::policy;

/// The longest a pacing override may last.
const MAX_OVERRIDE_US: i64 = 366 * 86_400 * 1_000_000;

/// Declares rate limit `name` (1 to 256 bytes) with `spec`: `{"rate": 10,
/// "period": "1s", "burst": 10, "key": "payload.tenant"}` (`period`
/// default 1 second, `burst` default `rate` rounded up, `key` default one
/// bucket). Tasks enqueued with `{"rate_limit": name}` wait outside the
/// ready set until their bucket admits them. Returns the stored spec.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn declare_rate_limit(name: Option<&str>, spec: Option<Jsonb>) -> pgrx::JsonB {
    let name = rate::check_name(name, "name");
    // The name rule (`args::new_name`): a limit declared already may be
    // declared again.
    args::new_name(name, "name", MAX_KEY_BYTES, || rate::declared(name).is_some());
    let spec = required(spec, "spec").parse("spec");
    let stored = rate::declare(name, &spec);
    audit::record("declare_rate_limit", name, "ok", stored.clone());
    pgrx::JsonB(stored)
}

/// The declared pace of `name` (a rate limit, or `workflow:<name>` for a
/// start throttle), refusing a keyed one: it has no single bucket.
fn unkeyed_pace(name: &str) -> Pace {
    let (pace, keyed) = match name.strip_prefix("workflow:") {
        Some(workflow) => match policy::load(workflow).throttle {
            Some(t) => (t.pace, t.key.is_some()),
            None => bad_argument(
                "name",
                format!(
                    "workflow {} has no start throttle on this shard",
                    sheaf_core::excerpt::quoted(workflow)
                ),
            ),
        },
        None => match rate::declared(name) {
            Some(l) => (l.pace, l.key.is_some()),
            None => bad_argument(
                "name",
                format!(
                    "{} is not a rate limit on this shard",
                    sheaf_core::excerpt::quoted(name)
                ),
            ),
        },
    };
    if keyed {
        not_ready(format!(
            "{} is keyed: each key has its own bucket, so there is no one pace to override",
            sheaf_core::excerpt::quoted(name)
        ));
    }
    pace
}

/// Paces `name` (a rate limit, or `workflow:<name>` for a start throttle)
/// at `rate` per `period` until `expires_at`, read on this shard's clock
/// (at most a year ahead); its burst stays. Units already timed within the
/// next 30 seconds keep their times. 55000 for a keyed limit.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn set_rate_override(
    name: Option<&str>,
    rate: Option<f64>,
    period: Option<Interval>,
    expires_at: Option<TimestampWithTimeZone>,
) {
    let name = rate::check_name(name, "name");
    let rate_value = required(rate, "rate");
    let period = delay_secs("period", required(period, "period"), 366.0 * 86_400.0);
    let expires_at = required(expires_at, "expires_at");
    let now = clock::now_us();
    if !expires_at.is_finite() || !(now + 1..=now + MAX_OVERRIDE_US).contains(&clock::to_us(expires_at)) {
        bad_argument("expires_at", "must be in the future, at most a year ahead");
    }
    let declared = unkeyed_pace(name);
    let pace = Pace::new(
        "override",
        rate_value,
        std::time::Duration::from_secs_f64(period),
        declared.burst,
    )
    .unwrap_or_else(|e| bad_argument(e.option.trim_start_matches("override."), e.why));
    rate::set_override(name, pace, expires_at);
    audit::record(
        "set_rate_override",
        name,
        "ok",
        serde_json::json!({"rate": rate_value, "period_secs": period, "expires_at": expires_at}),
    );
}

/// Removes `name`'s pacing override; whether a live one was removed.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn clear_rate_override(name: Option<&str>) -> bool {
    let name = rate::check_name(name, "name");
    let cleared = rate::clear_override(name);
    audit::record(
        "clear_rate_override",
        name,
        "ok",
        serde_json::json!({"cleared": cleared}),
    );
    cleared
}

/// This shard's rate limits: each spec, its live override, its buckets and
/// the units waiting in their lines.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn rate_limits() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(spec, pgrx::JsonB),
        name!(override_rate, Option<f64>),
        name!(override_period, Option<Interval>),
        name!(override_expires_at, Option<TimestampWithTimeZone>),
        name!(buckets, i64),
        name!(waiting, i64),
    ),
> {
    TableIterator::new(rate::list().into_iter().map(|l| {
        (
            l.name,
            l.spec,
            l.override_rate,
            l.override_period,
            l.override_expires_at,
            l.buckets,
            l.waiting,
        )
    }))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, declare, enqueue, init, start, values};
    use pgrx::prelude::*;
    use serde_json::json;

    fn limit(name: &str, spec: serde_json::Value) {
        Spi::run_with_args(
            "SELECT sheaf.declare_rate_limit($1, $2)",
            &[name.into(), pgrx::JsonB(spec).into()],
        )
        .expect("declare_rate_limit");
    }

    /// Seconds from now to each task's `run_at` on `queue`, in enqueue order
    /// (`None`: waiting in a line).
    fn delays(queue: &str) -> Vec<Option<f64>> {
        values(
            "SELECT CASE WHEN run_at = 'infinity' THEN NULL \
                    ELSE round(extract(epoch from run_at - now())::numeric, 3)::float8 END \
             FROM sheaf.tasks WHERE queue = $1 ORDER BY seq",
            &[queue.into()],
        )
    }

    #[pg_test]
    fn a_burst_goes_at_once_and_the_rest_at_the_pace() {
        init();
        limit("api", json!({"rate": 2, "period": "1s", "burst": 2}));
        for n in 0..5 {
            enqueue("q", json!({ "n": n }), json!({"rate_limit": "api"}));
        }
        assert_eq!(claim("q", 10).len(), 2, "the burst is ready now");
        assert_eq!(
            delays("q")[2..],
            [Some(0.5), Some(1.0), Some(1.5)],
            "then one every half second"
        );
    }

    #[pg_test]
    fn each_key_has_its_own_bucket_and_a_task_without_one_shares_one() {
        init();
        limit(
            "per_tenant",
            json!({"rate": 1, "period": "1 minute", "burst": 1, "key": "payload.t"}),
        );
        for t in ["a", "b", "a"] {
            enqueue("q", json!({ "t": t }), json!({"rate_limit": "per_tenant"}));
        }
        enqueue(
            "q",
            json!({}),
            json!({"rate_limit": "per_tenant", "rate_key": "b"}),
        );
        // a now, b now, a after a minute (beyond the lookahead: in a line), b too.
        assert_eq!(delays("q"), [Some(0.0), Some(0.0), None, None]);
        assert_eq!(count("SELECT count(*) FROM sheaf.rate_waiting"), 2);
    }

    #[pg_test]
    fn maintain_times_a_line_as_its_head_comes_within_the_lookahead() {
        init();
        limit("slow", json!({"rate": 1, "period": "1 minute", "burst": 1}));
        for n in 0..3 {
            enqueue("q", json!({ "n": n }), json!({"rate_limit": "slow"}));
        }
        assert_eq!(delays("q"), [Some(0.0), None, None]);
        let timed = || {
            Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'rate_units_timed')::bigint")
                .unwrap()
                .unwrap()
        };
        assert_eq!(timed(), 0, "a minute away: beyond the lookahead");
        // Fifty seconds later, as far as the bucket knows.
        Spi::run("UPDATE sheaf.rate_buckets SET tat = tat - interval '50 seconds', line_at = line_at - interval '50 seconds'")
            .unwrap();
        assert_eq!(timed(), 1);
        assert_eq!(delays("q"), [Some(0.0), Some(10.0), None], "in line order");
        assert_eq!(count("SELECT count(*) FROM sheaf.rate_waiting"), 1);
    }

    #[pg_test]
    fn caps_and_rate_limits_combine() {
        init();
        limit("fast", json!({"rate": 100, "burst": 100}));
        Spi::run("SELECT sheaf.set_concurrency_limit('k', 1)").unwrap();
        for n in 0..3 {
            enqueue(
                "q",
                json!({ "n": n }),
                json!({"rate_limit": "fast", "concurrency_key": "k"}),
            );
        }
        assert_eq!(claim("q", 10).len(), 1, "the cap holds the rest");
    }

    #[pg_test(
        error = "invalid opts.rate_limit: \"nope\" is not a rate limit on this shard: declare it first (sheaf.declare_rate_limit)"
    )]
    fn an_undeclared_limit_is_refused() {
        init();
        enqueue("q", json!({}), json!({"rate_limit": "nope"}));
    }

    #[pg_test]
    fn a_throttle_paces_starts_and_an_override_changes_the_pace() {
        init();
        declare("w", json!({"throttle": {"rate": 1, "period": "5s", "burst": 1}}));
        for n in 0..3 {
            let created = start("w", &n.to_string(), json!({})).created;
            assert!(created, "an over-rate start still creates its execution");
        }
        assert_eq!(delays("default"), [Some(0.0), Some(5.0), Some(10.0)]);
        Spi::run("SELECT sheaf.set_rate_override('workflow:w', 10, '1 second', now() + interval '1 hour')")
            .unwrap();
        start("w", "3", json!({}));
        assert_eq!(delays("default")[3], Some(15.0), "after the last one timed");
        start("w", "4", json!({}));
        assert_eq!(delays("default")[4], Some(15.1), "then at the new pace");
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.clear_rate_override('workflow:w')").unwrap(),
            Some(true)
        );
    }

    #[pg_test]
    fn a_run_whose_first_task_waits_in_a_line_cannot_move() {
        init();
        declare(
            "slow",
            json!({"throttle": {"rate": 1, "period": "1 hour", "burst": 1}}),
        );
        start("slow", "a", json!({}));
        let lined = start("slow", "b", json!({})).id;
        let blockers = Spi::get_one_with_args::<Vec<String>>(
            "SELECT blockers FROM sheaf.rebalance_candidates() WHERE execution_id = $1",
            &[lined.into()],
        )
        .unwrap()
        .unwrap();
        assert!(blockers.contains(&"rate_limited".to_owned()), "{blockers:?}");
    }

    #[pg_test(
        error = "\"per_tenant\" is keyed: each key has its own bucket, so there is no one pace to override"
    )]
    fn a_keyed_limit_refuses_an_override() {
        init();
        limit("per_tenant", json!({"rate": 1, "key": "payload.t"}));
        Spi::run("SELECT sheaf.set_rate_override('per_tenant', 5, '1 second', now() + interval '1 hour')")
            .unwrap();
    }
}
