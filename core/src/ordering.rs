//! The claim order, as static index keys.
//!
//! A ready task sits in the ready index under `(k1, k2, seq)`, ascending:
//! - `k1` is `-priority`, or with aging the aging key below;
//! - `k2` is the fairness start tag (0 outside fairness queues);
//! - `seq` is the enqueue sequence, so equal keys keep enqueue order.
//!
//! Aging: effective priority `priority + age / aging_secs` at a common `now`
//! orders tasks exactly like `enqueued_at - priority * aging_secs` ascending,
//! because `now / aging_secs` is the same for every row. So aging is an index
//! order, not a scan.
//!
//! Fairness: start-time fair queuing. Each fairness key keeps the finish tag
//! of its last task; a task's start tag is `max(vtime, key_finish)` and its
//! finish tag `start + 1 / weight`; the queue's virtual time `vtime` follows
//! the start tag of the tasks being claimed. Claiming by smallest start tag
//! interleaves backlogged keys in proportion to their weights.

/// How a queue orders its ready tasks. One mode per queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Priority,
    Aging { secs: u32 },
    Fairness,
}

/// The primary key `k1` of a task entering the ready set.
pub fn primary_key(mode: Mode, priority: i32, enqueued_unix_secs: f64) -> f64 {
    match mode {
        Mode::Priority | Mode::Fairness => -(priority as f64),
        Mode::Aging { secs } => enqueued_unix_secs - priority as f64 * secs as f64,
    }
}

/// Start and finish tags of a fairness task: `(start, finish)`.
pub fn fair_tags(vtime: f64, key_finish: Option<f64>, weight: f64) -> (f64, f64) {
    let start = match key_finish {
        Some(f) if f > vtime => f,
        _ => vtime,
    };
    (start, start + 1.0 / weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct Task {
        priority: i32,
        enqueued: f64,
        seq: u64,
    }

    fn task() -> impl Strategy<Value = Task> {
        (-5i32..5, 0u32..100_000, 0u64..1_000_000).prop_map(|(priority, enqueued, seq)| Task {
            priority,
            enqueued: enqueued as f64,
            seq,
        })
    }

    proptest! {
        /// The static aging key orders tasks exactly like the reference model,
        /// effective priority computed at claim time, for any claim time.
        #[test]
        fn aging_key_matches_the_reference_model(
            mut tasks in proptest::collection::vec(task(), 1..40),
            aging_secs in 1u32..3600,
            now_offset in 0u32..1_000_000,
        ) {
            for (i, t) in tasks.iter_mut().enumerate() {
                t.seq = i as u64;
            }
            let now = 100_000.0 + now_offset as f64;
            let mode = Mode::Aging { secs: aging_secs };
            let mut by_key = tasks.clone();
            by_key.sort_by(|a, b| {
                primary_key(mode, a.priority, a.enqueued)
                    .total_cmp(&primary_key(mode, b.priority, b.enqueued))
                    .then(a.seq.cmp(&b.seq))
            });
            let mut by_model = tasks.clone();
            // Effective priority, scaled by aging_secs so the comparison is exact
            // in f64: priority * aging_secs + (now - enqueued).
            let effective = |t: &Task| t.priority as f64 * aging_secs as f64 + (now - t.enqueued);
            by_model.sort_by(|a, b| effective(b).total_cmp(&effective(a)).then(a.seq.cmp(&b.seq)));
            let ka: Vec<u64> = by_key.iter().map(|t| t.seq).collect();
            let kb: Vec<u64> = by_model.iter().map(|t| t.seq).collect();
            prop_assert_eq!(ka, kb);
        }
    }

    #[test]
    fn priority_mode_puts_higher_priority_first() {
        assert!(primary_key(Mode::Priority, 5, 0.0) < primary_key(Mode::Priority, 1, 0.0));
        assert_eq!(primary_key(Mode::Fairness, 3, 99.0), -3.0);
    }

    /// Backlogged keys with weights 1, 2 and 3, claimed by smallest start tag:
    /// over every window, each key's count stays within 1 task of its
    /// weighted share (plus the rounding of the share itself).
    #[test]
    fn fair_tags_give_each_key_its_weighted_share_over_any_window() {
        let weights = [1.0, 2.0, 3.0];
        let mut finish: [Option<f64>; 3] = [None; 3];
        let mut vtime = 0.0;
        // 600 tasks per key, enqueued up front (all backlogged from the start).
        let mut ready = Vec::new();
        let mut seq = 0u64;
        for _ in 0..600 {
            for (k, w) in weights.iter().enumerate() {
                let (start, fin) = fair_tags(vtime, finish[k], *w);
                finish[k] = Some(fin);
                ready.push((start, seq, k));
                seq += 1;
            }
        }
        ready.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let claimed: Vec<usize> = ready
            .iter()
            .take(600)
            .map(|t| {
                vtime = t.0;
                t.2
            })
            .collect();
        let total_weight: f64 = weights.iter().sum();
        for window in [6usize, 60, 600] {
            for start in (0..=claimed.len() - window).step_by(7) {
                let slice = &claimed[start..start + window];
                for (k, w) in weights.iter().enumerate() {
                    let got = slice.iter().filter(|&&c| c == k).count() as f64;
                    let share = window as f64 * w / total_weight;
                    assert!(
                        (got - share).abs() <= 2.0,
                        "key {k} got {got} of {window}, share {share}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_idle_key_starts_at_the_virtual_time_not_in_the_past() {
        assert_eq!(fair_tags(10.0, Some(3.0), 1.0), (10.0, 11.0));
        assert_eq!(fair_tags(10.0, None, 2.0), (10.0, 10.5));
        assert_eq!(fair_tags(10.0, Some(12.0), 4.0), (12.0, 12.25));
    }
}
