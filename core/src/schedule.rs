//! Schedules (`sheaf.create_schedule`): parsing a spec, the fire times of
//! its timing, and what a sweep fires after downtime.
//!
//! A timing is a cron expression of 5 fields (minute first) or 6 (second
//! first), a nickname (`@hourly`, `@daily`, `@weekly`, `@monthly`,
//! `@yearly`), or `@every <duration>` (multiples of the duration since the
//! Unix epoch, so `@every 1h` fires on the hour in UTC). A cron expression is
//! read in the schedule's time zone (an IANA name, `UTC` by default), and
//! its fire times are instants whose wall-clock time there matches, with two
//! rules for daylight-saving changes:
//! - a wall-clock time skipped by a spring-forward change fires once, at the
//!   change (a daily 02:30 fires at 03:00 that day), unless the expression's
//!   hour field is `*` (then the skipped times simply do not occur);
//! - a wall-clock time repeated by a fall-back change fires once, at its
//!   first occurrence, unless the expression's hour field is `*` (then it
//!   fires in both passes: every 15 minutes stays every 15 minutes).
//!
//! Times are microseconds since the Unix epoch; fire times fall on whole
//! seconds.

use std::collections::VecDeque;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde_json::{Map, Value, json};

use crate::excerpt::{excerpt, quoted};
use crate::options::{EnqueueOptions, OptionError, check_queue_name};
use crate::policy::StartOptions;

const SECOND: i64 = 1_000_000;
/// The longest cron expression or time zone name, in bytes.
const MAX_EXPR_BYTES: usize = 256;
/// The shortest `@every`.
const MIN_EVERY: Duration = Duration::from_secs(1);
/// The longest `@every` and `jitter`.
const MAX_EVERY: Duration = Duration::from_secs(366 * 86_400);
/// `catch_up: "skip"` fires the latest missed time only if it is at most
/// this late.
pub const SKIP_GRACE: i64 = 60 * SECOND;
/// The most fire times `catch_up: "all"` fires after downtime.
pub const MAX_CATCH_UP: usize = 1000;
/// The longest a search for the next fire time looks ahead: a timing that
/// does not fire within it is refused at creation (`0 0 30 2 *`).
const HORIZON: i64 = 30 * 366 * 86_400 * SECOND;
/// Offsets are probed this often to find a change between two instants;
/// no zone changes its offset twice within it.
const PROBE: i64 = 6 * 3600 * SECOND;

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum Timing {
    Cron(Box<CronTiming>),
    Every(Duration),
}

/// A cron expression read in a time zone.
#[derive(Debug, Clone)]
pub struct CronTiming {
    cron: Cron,
    tz: Tz,
    /// The hour field is `*`: repeated wall-clock times fire in both passes,
    /// skipped ones not at all.
    every_hour: bool,
}

impl Timing {
    /// Parses `expr` read in `tz` (`@every` ignores the zone).
    pub fn parse(expr: &str, tz: &str) -> Result<Timing, OptionError> {
        let expr = expr.trim();
        if expr.is_empty() || expr.len() > MAX_EXPR_BYTES {
            return Err(err(
                "spec.cron",
                format!("must be 1 to {MAX_EXPR_BYTES} bytes, got {}", expr.len()),
            ));
        }
        if let Some(every) = expr.strip_prefix("@every") {
            let d = crate::duration::parse(&Value::String(every.trim().to_owned()), MIN_EVERY, MAX_EVERY)
                .map_err(|why| err("spec.cron", format!("@every: {why}")))?;
            if d.subsec_nanos() != 0 {
                return Err(err("spec.cron", "@every must be whole seconds"));
            }
            return Ok(Timing::Every(d));
        }
        let tz = Tz::from_str(tz).map_err(|_| {
            err(
                "spec.time_zone",
                format!(
                    "{} is not an IANA time zone name (like \"Europe/Berlin\" or \"UTC\")",
                    quoted(tz)
                ),
            )
        })?;
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let every_hour = match fields.as_slice() {
            [nick] if nick.starts_with('@') => nick.eq_ignore_ascii_case("@hourly"),
            [_, hour, _, _, _] | [_, _, hour, _, _, _] => *hour == "*",
            _ => {
                return Err(err(
                    "spec.cron",
                    format!(
                        "must have 5 fields (minute hour day month weekday) or 6 (second first), or be @hourly, \
                         @daily, @weekly, @monthly, @yearly or @every <duration>; got {}",
                        quoted(expr)
                    ),
                ));
            }
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| {
                err(
                    "spec.cron",
                    format!("{} is not a cron expression: {}", quoted(expr), excerpt(e)),
                )
            })?;
        Ok(Timing::Cron(Box::new(CronTiming { cron, tz, every_hour })))
    }

    /// The first fire time strictly after `after`; `None` if there is none
    /// within 30 years.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        match self {
            Timing::Every(d) => {
                let period = d.as_secs() as i64 * SECOND;
                Some((after.div_euclid(period) + 1) * period)
            }
            Timing::Cron(c) => c.next_after(after),
        }
    }
}

fn instant(us: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us)
}

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

impl CronTiming {
    fn offset(&self, us: i64) -> i64 {
        instant(us).map_or(0, |t| {
            i64::from(
                self.tz
                    .offset_from_utc_datetime(&t.naive_utc())
                    .fix()
                    .local_minus_utc(),
            ) * SECOND
        })
    }

    /// The first wall-clock time matching the expression at or after
    /// `from` (wall-clock microseconds), if any within the horizon.
    fn next_wall(&self, from: i64, inclusive: bool) -> Option<i64> {
        let start = instant(from)?;
        let found = self.cron.find_next_occurrence(&start, inclusive).ok()?;
        let found = micros(found);
        (found - from <= HORIZON).then_some(found)
    }

    /// The first offset change in `(from, to]`, as the instant it happens.
    fn change_between(&self, from: i64, to: i64) -> Option<i64> {
        let o = self.offset(from);
        let mut lo = from;
        let mut hi = None;
        let mut probe = from;
        while probe < to {
            probe = (probe + PROBE).min(to);
            if self.offset(probe) != o {
                hi = Some(probe);
                break;
            }
            lo = probe;
        }
        let mut hi = hi?;
        // The offset is `o` at `lo` and another at `hi`: the change is the
        // first second of the new offset.
        while hi - lo > SECOND {
            let mid = lo + (hi - lo) / 2 / SECOND * SECOND;
            let mid = if mid == lo { lo + SECOND } else { mid };
            if self.offset(mid) == o {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(hi)
    }

    fn next_after(&self, after: i64) -> Option<i64> {
        // Whole seconds: a fire at `after`'s own second is not after it.
        let mut from = after.div_euclid(SECOND) * SECOND;
        let mut wall = from + self.offset(from);
        let mut inclusive = false;
        if !self.every_hour {
            // In the second pass of a fall-back: its wall-clock times fired
            // in the first.
            let window = 3 * 3600 * SECOND;
            if let Some(change) = self.change_between(from - window, from) {
                let before = self.offset(change - SECOND);
                let end = change + before;
                if before > self.offset(change) && wall < end {
                    (wall, inclusive) = (end, true);
                }
            }
        }
        // Each turn crosses one offset change; a few suffice.
        for _ in 0..64 {
            let o = self.offset(from);
            let next = self.next_wall(wall, inclusive)?;
            let at = next - o;
            let Some(change) = self.change_between(from, at) else {
                return Some(at);
            };
            // No match before the change under offset `o`; after it, `o2`.
            let o2 = self.offset(change);
            let (end, start) = (change + o, change + o2);
            if o2 > o {
                // Spring forward: wall-clock [end, start) never happens.
                if !self.every_hour && self.next_wall(end, true).is_some_and(|w| w < start) {
                    return Some(change);
                }
                wall = start;
            } else {
                // Fall back: wall-clock [start, end) happens again.
                wall = if self.every_hour { start } else { end };
            }
            from = change;
            inclusive = true;
        }
        None
    }
}

/// What a schedule starts at each fire.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A workflow: `workflow_id` is `<id_prefix>@<fire time>`.
    Workflow {
        name: String,
        input: Value,
        id_prefix: String,
        opts: StartOptions,
        opts_json: Value,
    },
    /// A task on a queue.
    Task {
        queue: String,
        payload: Value,
        opts: EnqueueOptions,
        opts_json: Value,
    },
}

/// What a fire does while the previous fire's run or task is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    Skip,
    Allow,
    CancelPrevious,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::CancelPrevious => "cancel_previous",
        }
    }
}

/// Which missed fire times a sweep fires after downtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// The latest, if at most a minute late; none otherwise.
    Skip,
    /// The latest, however late.
    Once,
    /// The latest `n`, oldest first.
    All(usize),
}

/// A parsed schedule spec.
#[derive(Debug, Clone)]
pub struct Spec {
    pub timing: Timing,
    pub action: Action,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    /// The spread of a fire's start after its time, in microseconds.
    pub jitter: i64,
    /// The spec with every default spelled out.
    pub normalized: Value,
}

const SPEC_FIELDS: &[&str] = &[
    "cron",
    "time_zone",
    "workflow",
    "task",
    "overlap",
    "catch_up",
    "catch_up_max",
    "jitter",
];

fn object<'a>(name: &str, v: &'a Value, accepted: &[&str]) -> Result<&'a Map<String, Value>, OptionError> {
    let map = v
        .as_object()
        .ok_or_else(|| err(name, format!("must be a JSON object, got {}", excerpt(v))))?;
    if let Some(k) = map.keys().find(|k| !accepted.contains(&k.as_str())) {
        return Err(err(
            name,
            format!("unknown field {} (accepted: {})", quoted(k), accepted.join(", ")),
        ));
    }
    Ok(map)
}

fn string<'a>(name: &str, v: Option<&'a Value>) -> Result<Option<&'a str>, OptionError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(err(name, format!("must be a string, got {}", excerpt(other)))),
    }
}

fn required<'a>(name: &str, v: Option<&'a Value>) -> Result<&'a str, OptionError> {
    string(name, v)?.ok_or_else(|| err(name, "is required"))
}

fn name_like(name: &str, s: &str, max: usize) -> Result<(), OptionError> {
    if s.is_empty() || s.len() > max {
        return Err(err(name, format!("must be 1 to {max} bytes, got {}", s.len())));
    }
    Ok(())
}

fn action(spec: &Map<String, Value>) -> Result<Action, OptionError> {
    match (spec.get("workflow"), spec.get("task")) {
        (Some(w), None) => {
            let w = object("spec.workflow", w, &["name", "input", "workflow_id", "opts"])?;
            let name = required("spec.workflow.name", w.get("name"))?;
            name_like("spec.workflow.name", name, 256)?;
            let id_prefix = string("spec.workflow.workflow_id", w.get("workflow_id"))?.unwrap_or(name);
            // `@` and an RFC 3339 time follow, within the id's 256 bytes.
            name_like("spec.workflow.workflow_id", id_prefix, 200)?;
            let opts_json = w.get("opts").cloned().unwrap_or_else(|| json!({}));
            let opts = StartOptions::parse(&opts_json)
                .map_err(|e| err(&format!("spec.workflow.{}", e.option), e.why))?;
            if opts.execution_id.is_some() || opts.run_at.is_some() {
                return Err(err(
                    "spec.workflow.opts",
                    "execution_id and run_at are set by each fire, not by the spec",
                ));
            }
            Ok(Action::Workflow {
                name: name.to_owned(),
                input: w.get("input").cloned().unwrap_or_else(|| json!({})),
                id_prefix: id_prefix.to_owned(),
                opts,
                opts_json,
            })
        }
        (None, Some(t)) => {
            let t = object("spec.task", t, &["queue", "payload", "opts"])?;
            let queue = required("spec.task.queue", t.get("queue"))?;
            check_queue_name(queue).map_err(|why| err("spec.task.queue", why))?;
            let opts_json = t.get("opts").cloned().unwrap_or_else(|| json!({}));
            let opts = EnqueueOptions::parse(&opts_json)
                .map_err(|e| err(&format!("spec.task.{}", e.option), e.why))?;
            if opts.execution_id.is_some() || opts.run_at.is_some() || opts.idempotency_key.is_some() {
                return Err(err(
                    "spec.task.opts",
                    "execution_id, run_at and idempotency_key are set by each fire, not by the spec",
                ));
            }
            Ok(Action::Task {
                queue: queue.to_owned(),
                payload: t.get("payload").cloned().unwrap_or_else(|| json!({})),
                opts,
                opts_json,
            })
        }
        _ => Err(err(
            "spec",
            "must name exactly one of \"workflow\" ({\"name\", \"input\"}) or \"task\" ({\"queue\", \"payload\"})",
        )),
    }
}

fn catch_up(m: &Map<String, Value>) -> Result<CatchUp, OptionError> {
    let max = match m.get("catch_up_max") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| (1..=MAX_CATCH_UP as u64).contains(n))
                .ok_or_else(|| {
                    err(
                        "spec.catch_up_max",
                        format!(
                            "must be a whole number from 1 to {MAX_CATCH_UP}, got {}",
                            excerpt(v)
                        ),
                    )
                })? as usize,
        ),
    };
    let catch_up = match string("spec.catch_up", m.get("catch_up"))? {
        None | Some("once") => CatchUp::Once,
        Some("skip") => CatchUp::Skip,
        Some("all") => CatchUp::All(max.unwrap_or(10)),
        Some(other) => {
            return Err(err(
                "spec.catch_up",
                format!("must be skip, once or all, got {}", quoted(other)),
            ));
        }
    };
    if max.is_some() && !matches!(catch_up, CatchUp::All(_)) {
        return Err(err("spec.catch_up_max", "applies only to catch_up \"all\""));
    }
    Ok(catch_up)
}

impl Spec {
    pub fn parse(spec: &Value) -> Result<Spec, OptionError> {
        let m = object("spec", spec, SPEC_FIELDS)?;
        let expr = required("spec.cron", m.get("cron"))?;
        let tz = string("spec.time_zone", m.get("time_zone"))?.unwrap_or("UTC");
        name_like("spec.time_zone", tz, MAX_EXPR_BYTES)?;
        let timing = Timing::parse(expr, tz)?;
        let action = action(m)?;
        let overlap = match string("spec.overlap", m.get("overlap"))? {
            None | Some("skip") => Overlap::Skip,
            Some("allow") => Overlap::Allow,
            Some("cancel_previous") => Overlap::CancelPrevious,
            Some(other) => {
                return Err(err(
                    "spec.overlap",
                    format!("must be skip, allow or cancel_previous, got {}", quoted(other)),
                ));
            }
        };
        let catch_up = catch_up(m)?;
        let jitter = match m.get("jitter") {
            None | Some(Value::Null) => Duration::ZERO,
            Some(v) => {
                crate::duration::parse(v, Duration::ZERO, MAX_EVERY).map_err(|why| err("spec.jitter", why))?
            }
        };
        let jitter = jitter.as_micros() as i64;
        // A timing that never fires is refused, not stored.
        let now = Utc::now().timestamp_micros();
        if timing.next_after(now).is_none() {
            return Err(err(
                "spec.cron",
                format!("{} never fires (no time matches within 30 years)", quoted(expr)),
            ));
        }
        let mut normalized = json!({
            "cron": expr.trim(),
            "time_zone": tz,
            "overlap": overlap.as_str(),
            "catch_up": match catch_up { CatchUp::Skip => "skip", CatchUp::Once => "once", CatchUp::All(_) => "all" },
            "jitter": humantime::format_duration(Duration::from_micros(jitter as u64)).to_string(),
        });
        if let CatchUp::All(n) = catch_up {
            normalized["catch_up_max"] = json!(n);
        }
        match &action {
            Action::Workflow {
                name,
                input,
                id_prefix,
                opts_json,
                ..
            } => {
                normalized["workflow"] =
                    json!({"name": name, "input": input, "workflow_id": id_prefix, "opts": opts_json});
            }
            Action::Task {
                queue,
                payload,
                opts_json,
                ..
            } => {
                normalized["task"] = json!({"queue": queue, "payload": payload, "opts": opts_json});
            }
        }
        Ok(Spec {
            timing,
            action,
            overlap,
            catch_up,
            jitter,
            normalized,
        })
    }

    /// The delay of fire `fire_at`'s start: the same for every sweep that
    /// looks at it, spread over `[0, jitter)` by schedule and time.
    pub fn jitter_of(&self, schedule: &str, fire_at: i64) -> i64 {
        if self.jitter <= 0 {
            return 0;
        }
        let mut h = xxhash_rust::xxh64::Xxh64::new(0);
        h.update(schedule.as_bytes());
        h.update(&fire_at.to_le_bytes());
        (h.digest() % self.jitter as u64) as i64
    }
}

/// What one sweep does with a schedule's due fire times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Fire times to fire now, oldest first.
    pub fire: Vec<i64>,
    /// Due times passed over (catch-up policy).
    pub skipped: u64,
    /// Where the next sweep starts: the first fire time not yet handled.
    pub next: Option<i64>,
}

/// The fire times due at `now` from `next` on (`next` itself, a fire time,
/// is due if `<= now`), looked at `budget` at most (a schedule far behind catches up
/// over several sweeps, firing only once it has caught up).
pub fn plan(timing: &Timing, catch_up: CatchUp, next: i64, now: i64, budget: usize) -> Plan {
    let keep = match catch_up {
        CatchUp::All(n) => n.max(1),
        _ => 1,
    };
    let mut seen: VecDeque<i64> = VecDeque::with_capacity(keep);
    let mut skipped = 0;
    // `next` is a fire time when sheaf wrote it; one set by hand is read as
    // "from here on".
    let mut t = timing.next_after(next - 1);
    let mut looked = 0;
    while let Some(at) = t.filter(|&at| at <= now) {
        if looked == budget {
            // Not caught up: what is kept is looked at again next time.
            return Plan {
                fire: Vec::new(),
                skipped,
                next: seen.front().copied().or(Some(at)),
            };
        }
        if seen.len() == keep {
            seen.pop_front();
            skipped += 1;
        }
        seen.push_back(at);
        t = timing.next_after(at);
        looked += 1;
    }
    let mut fire: Vec<i64> = seen.into();
    if catch_up == CatchUp::Skip && fire.last().is_some_and(|&last| now - last > SKIP_GRACE) {
        fire.clear();
        skipped += 1;
    }
    Plan {
        fire,
        skipped,
        next: t,
    }
}

/// `fire_at` as RFC 3339 UTC with whole seconds (a scheduled workflow id's
/// suffix).
pub fn fire_label(fire_at: i64) -> String {
    instant(fire_at).map_or_else(
        || fire_at.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::LocalResult;

    fn at(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_micros()
    }

    fn show(us: i64) -> String {
        instant(us)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn fires(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        let t = Timing::parse(expr, tz).unwrap();
        let mut out = Vec::new();
        let mut cur = at(from);
        for _ in 0..n {
            cur = t.next_after(cur).unwrap();
            out.push(show(cur));
        }
        out
    }

    #[test]
    fn five_and_six_fields_and_nicknames() {
        assert_eq!(
            fires("*/15 * * * *", "UTC", "2026-01-01T00:07:00Z", 2),
            ["2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z"]
        );
        assert_eq!(
            fires("30 * * * * *", "UTC", "2026-01-01T00:00:30Z", 2),
            ["2026-01-01T00:01:30Z", "2026-01-01T00:02:30Z"]
        );
        assert_eq!(
            fires("@daily", "UTC", "2026-01-01T00:00:00Z", 1),
            ["2026-01-02T00:00:00Z"]
        );
        assert_eq!(
            fires("@hourly", "UTC", "2026-01-01T00:59:59Z", 1),
            ["2026-01-01T01:00:00Z"]
        );
        assert_eq!(
            fires("@every 30s", "UTC", "2026-01-01T00:00:10Z", 2),
            ["2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"]
        );
    }

    #[test]
    fn a_fire_is_strictly_after_the_time_asked() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let noon = at("2026-01-01T12:00:00Z");
        assert_eq!(show(t.next_after(noon).unwrap()), "2026-01-01T13:00:00Z");
        assert_eq!(show(t.next_after(noon - 1).unwrap()), "2026-01-01T12:00:00Z");
        assert_eq!(
            show(t.next_after(noon + 500_000).unwrap()),
            "2026-01-01T13:00:00Z"
        );
    }

    #[test]
    fn leap_days() {
        assert_eq!(
            fires("0 12 29 2 *", "UTC", "2026-03-01T00:00:00Z", 2),
            ["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"]
        );
        // Europe/Berlin: UTC+1 in winter.
        assert_eq!(
            fires("0 0 29 2 *", "Europe/Berlin", "2027-06-01T00:00:00Z", 1),
            ["2028-02-28T23:00:00Z"]
        );
    }

    #[test]
    fn a_time_in_the_zone_follows_its_offset_through_the_year() {
        // 09:00 in New York: 14:00Z in winter (EST), 13:00Z in summer (EDT).
        assert_eq!(
            fires("0 9 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3),
            [
                "2026-03-07T14:00:00Z",
                "2026-03-08T13:00:00Z",
                "2026-03-09T13:00:00Z"
            ]
        );
    }

    #[test]
    fn spring_forward_fires_a_skipped_fixed_time_at_the_change() {
        // New York, 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00Z).
        assert_eq!(
            fires("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3),
            [
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
                "2026-03-10T06:30:00Z"
            ]
        );
        // Every 30 minutes: 01:30 EST, then 03:00 EDT (02:00 and 02:30 never happen).
        assert_eq!(
            fires("*/30 * * * *", "America/New_York", "2026-03-08T06:00:00Z", 3),
            [
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:30:00Z"
            ]
        );
    }

    #[test]
    fn fall_back_fires_a_repeated_fixed_time_once_and_an_hourly_one_in_both_passes() {
        // New York, 2026-11-01: 02:00 EDT becomes 01:00 EST (06:00Z); 01:xx happens twice.
        assert_eq!(
            fires("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
        assert_eq!(
            fires("30 * * * *", "America/New_York", "2026-11-01T04:00:00Z", 4),
            [
                "2026-11-01T04:30:00Z", // 00:30 EDT
                "2026-11-01T05:30:00Z", // 01:30 EDT
                "2026-11-01T06:30:00Z", // 01:30 EST
                "2026-11-01T07:30:00Z", // 02:30 EST
            ]
        );
        // Asked from inside the first pass: the second pass still comes.
        assert_eq!(
            fires("*/20 * * * *", "America/New_York", "2026-11-01T05:50:00Z", 3),
            [
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:20:00Z",
                "2026-11-01T06:40:00Z"
            ]
        );
        // A fixed time asked from inside the second pass waits for the next day.
        assert_eq!(
            fires("30 1 * * *", "America/New_York", "2026-11-01T06:10:00Z", 1),
            ["2026-11-02T06:30:00Z"]
        );
    }

    /// The rules above, checked minute by minute against every instant of
    /// a day around each change of a few zones.
    #[test]
    fn every_fire_around_a_change_is_what_the_rules_say() {
        let windows = [
            ("America/New_York", "2026-03-07T12:00:00Z"),
            ("America/New_York", "2026-10-31T12:00:00Z"),
            ("Europe/Berlin", "2026-10-24T12:00:00Z"),
            ("Australia/Lord_Howe", "2026-04-04T00:00:00Z"),
            ("Australia/Lord_Howe", "2026-10-03T00:00:00Z"),
        ];
        let exprs = [
            "*/20 * * * *",
            "30 1 * * *",
            "30 2 * * *",
            "0 * * * *",
            "15,45 1,2,3 * * *",
            "0 2 * * *",
            "45 1 * * *",
        ];
        for (zone, from) in windows {
            let tz = Tz::from_str(zone).unwrap();
            for expr in exprs {
                let t = Timing::parse(expr, zone).unwrap();
                let Timing::Cron(c) = &t else { unreachable!() };
                let start = at(from);
                let end = start + 48 * 3600 * SECOND;
                let mut expected = Vec::new();
                let mut i = start + 60 * SECOND;
                while i <= end {
                    let utc = instant(i).unwrap();
                    let local = utc.with_timezone(&tz).naive_local();
                    let matches = c.cron.is_time_matching(&local.and_utc()).unwrap();
                    let second_pass =
                        matches!(tz.from_local_datetime(&local), LocalResult::Ambiguous(_, b) if b == utc);
                    if matches && (c.every_hour || !second_pass) {
                        expected.push(i);
                    }
                    // A spring-forward change: a fixed time in the gap fires at it.
                    let before = c.offset(i - 60 * SECOND);
                    let now = c.offset(i);
                    if !c.every_hour && now > before && !expected.contains(&i) {
                        let mut w = i + before;
                        while w < i + now {
                            if c.cron.is_time_matching(&instant(w).unwrap()).unwrap() {
                                expected.push(i);
                                break;
                            }
                            w += 60 * SECOND;
                        }
                    }
                    i += 60 * SECOND;
                }
                let mut got = Vec::new();
                let mut cur = start;
                while let Some(next) = t.next_after(cur).filter(|&n| n <= end) {
                    got.push(next);
                    cur = next;
                }
                let show_all = |v: &[i64]| v.iter().map(|&u| show(u)).collect::<Vec<_>>();
                assert_eq!(
                    show_all(&got),
                    show_all(&expected),
                    "{expr} in {zone} from {from}"
                );
            }
        }
    }

    #[test]
    fn a_southern_zone_changes_the_other_way() {
        // Sydney, 2026-04-05: 03:00 AEDT becomes 02:00 AEST (16:00Z on the 4th).
        assert_eq!(
            fires("30 2 * * *", "Australia/Sydney", "2026-04-04T12:00:00Z", 2),
            ["2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"]
        );
    }

    #[test]
    fn bad_timings_are_refused_with_what_was_wrong() {
        for (expr, tz) in [
            ("", "UTC"),
            ("* * * *", "UTC"),
            ("* * * * * * *", "UTC"),
            ("61 * * * *", "UTC"),
            ("* * * * *", "Mars/Olympus"),
            ("@every 0s", "UTC"),
            ("@every 1.5s", "UTC"),
            ("@every soon", "UTC"),
            ("@fortnightly", "UTC"),
        ] {
            let e = Timing::parse(expr, tz).unwrap_err();
            assert!(e.option.starts_with("spec."), "{expr}: {e}");
        }
        let huge = "1 ".repeat(5000);
        let e = Timing::parse(&huge, "UTC").unwrap_err();
        assert!(e.why.len() < 300, "{}", e.why.len());
    }

    #[test]
    fn a_spec_is_normalized_and_never_firing_is_refused() {
        let s =
            Spec::parse(&json!({"cron": "@hourly", "task": {"queue": "q", "payload": {"a": 1}}})).unwrap();
        assert_eq!(s.normalized["overlap"], "skip");
        assert_eq!(s.normalized["catch_up"], "once");
        assert_eq!(s.normalized["task"]["payload"]["a"], 1);
        let again = Spec::parse(&s.normalized).unwrap();
        assert_eq!(again.normalized, s.normalized);
        for bad in [
            json!({"cron": "0 0 30 2 *", "task": {"queue": "q"}}),
            json!({"cron": "@hourly"}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "workflow": {"name": "w"}}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "overlap": "sometimes"}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "catch_up_max": 5}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "catch_up": "all", "catch_up_max": 0}),
            json!({"cron": "@hourly", "task": {"queue": "q", "opts": {"run_at": "2030-01-01"}}}),
            json!({"cron": "@hourly", "workflow": {"name": "w", "opts": {"execution_id": "000118bc-fe56-8800-9234-56789abcdef0"}}}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "jitter": "2 years"}),
            json!({"cron": "@hourly", "task": {"queue": "q"}, "color": "red"}),
        ] {
            assert!(Spec::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn catch_up_policies_after_downtime() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let next = at("2026-01-01T01:00:00Z");
        let now = at("2026-01-01T05:30:00Z"); // 01..05 are due, 05:00 is 30 minutes late
        let p = plan(&t, CatchUp::Once, next, now, 10_000);
        assert_eq!(p.fire, [at("2026-01-01T05:00:00Z")]);
        assert_eq!((p.skipped, p.next), (4, Some(at("2026-01-01T06:00:00Z"))));
        let p = plan(&t, CatchUp::Skip, next, now, 10_000);
        assert_eq!((p.fire.len(), p.skipped), (0, 5));
        let p = plan(&t, CatchUp::Skip, next, at("2026-01-01T01:00:30Z"), 10_000);
        assert_eq!(p.fire, [next], "on time is not a catch-up");
        let p = plan(&t, CatchUp::All(3), next, now, 10_000);
        assert_eq!(
            p.fire,
            [
                at("2026-01-01T03:00:00Z"),
                at("2026-01-01T04:00:00Z"),
                at("2026-01-01T05:00:00Z")
            ]
        );
        assert_eq!(p.skipped, 2);
        let p = plan(&t, CatchUp::Once, at("2026-01-01T06:00:00Z"), now, 10_000);
        assert_eq!(
            (p.fire.len(), p.skipped, p.next),
            (0, 0, Some(at("2026-01-01T06:00:00Z")))
        );
    }

    #[test]
    fn far_behind_catches_up_over_several_sweeps_keeping_the_latest() {
        let t = Timing::parse("@every 1s", "UTC").unwrap();
        let start = at("2026-01-01T00:00:00Z");
        let now = start + 100 * SECOND;
        let mut next = start;
        let mut sweeps = 0;
        let fired = loop {
            let p = plan(&t, CatchUp::All(5), next, now, 30);
            sweeps += 1;
            next = p.next.unwrap();
            if !p.fire.is_empty() {
                break p.fire;
            }
        };
        assert!(sweeps > 3);
        assert_eq!(fired, (96..=100).map(|s| start + s * SECOND).collect::<Vec<_>>());
    }

    #[test]
    fn jitter_is_stable_and_within_its_bound() {
        let s = Spec::parse(&json!({"cron": "@hourly", "task": {"queue": "q"}, "jitter": "30s"})).unwrap();
        let a = s.jitter_of("nightly", 1_000_000);
        assert_eq!(a, s.jitter_of("nightly", 1_000_000));
        assert!((0..30 * SECOND).contains(&a));
    }
}
