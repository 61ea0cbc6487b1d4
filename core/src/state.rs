//! The states of tasks and executions, as the schema spells them.
//!
//! `sql/schema.sql` stores them as text (with CHECK constraints); these enums
//! are the one place Rust names them, so a typo is a compile error rather
//! than a silently unmatched string.

use std::fmt;
use std::str::FromStr;

/// A task's place in the queue (`tasks.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Due later (`run_at`, or a retry's backoff): not in the ready set.
    Scheduled,
    /// Due, but its concurrency key has no free slot: in the key's line.
    Waiting,
    /// Claimable: in the ready set, holding a slot of its key.
    Ready,
    /// Claimed under a lease, holding a slot of its key.
    Running,
    /// Its execution is paused: holds no slot until it resumes.
    Paused,
}

impl TaskState {
    pub const ALL: [TaskState; 5] = [
        TaskState::Scheduled,
        TaskState::Waiting,
        TaskState::Ready,
        TaskState::Running,
        TaskState::Paused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Waiting => "waiting",
            TaskState::Ready => "ready",
            TaskState::Running => "running",
            TaskState::Paused => "paused",
        }
    }

    /// Whether a task in this state counts toward its key's `admitted`.
    pub fn holds_slot(self) -> bool {
        matches!(self, TaskState::Ready | TaskState::Running)
    }
}

/// An execution's state (`executions.state`). New states may come in a
/// later release, so a match outside this crate needs a catch-all arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExecutionState {
    /// Active: its tasks run.
    Running,
    /// Active, asleep until woken (or its `wake_at`).
    Suspended,
    /// Active, held: its tasks wait, holding no slot, until it resumes.
    Paused,
    /// Ended with a result.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended by a cancel (or superseded by a newer start, latest wins).
    Cancelled,
    /// Ended by an operator (`terminate_execution`).
    Terminated,
    /// Ended because it ran out of time.
    TimedOut,
    /// Ended, continued by a new execution.
    ContinuedAsNew,
    /// Being moved to another shard (rebalancing).
    Migrating,
    /// Moved to another shard; this one still holds its workflow id.
    Migrated,
}

impl ExecutionState {
    pub const ALL: [ExecutionState; 11] = [
        ExecutionState::Running,
        ExecutionState::Suspended,
        ExecutionState::Paused,
        ExecutionState::Completed,
        ExecutionState::Failed,
        ExecutionState::Cancelled,
        ExecutionState::Terminated,
        ExecutionState::TimedOut,
        ExecutionState::ContinuedAsNew,
        ExecutionState::Migrating,
        ExecutionState::Migrated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionState::Running => "RUNNING",
            ExecutionState::Suspended => "SUSPENDED",
            ExecutionState::Paused => "PAUSED",
            ExecutionState::Completed => "COMPLETED",
            ExecutionState::Failed => "FAILED",
            ExecutionState::Cancelled => "CANCELLED",
            ExecutionState::Terminated => "TERMINATED",
            ExecutionState::TimedOut => "TIMED_OUT",
            ExecutionState::ContinuedAsNew => "CONTINUED_AS_NEW",
            ExecutionState::Migrating => "MIGRATING",
            ExecutionState::Migrated => "MIGRATED",
        }
    }

    /// Running, suspended or paused: what uniqueness, gates and quotas count.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            ExecutionState::Running | ExecutionState::Suspended | ExecutionState::Paused
        )
    }

    /// Being moved to, or moved to, another shard: its own shard ends it.
    pub fn is_migrating(self) -> bool {
        matches!(self, ExecutionState::Migrating | ExecutionState::Migrated)
    }

    /// Whether it takes new tasks (a paused one parks them).
    pub fn takes_tasks(self) -> bool {
        self.is_active()
    }
}

/// What a task runs for (`tasks.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskKind {
    /// A unit of work; its result is recorded in its execution's history.
    Activity,
    /// A workflow's own step: it decides what its execution does next.
    Workflow,
}

impl TaskKind {
    pub const ALL: [TaskKind; 2] = [TaskKind::Activity, TaskKind::Workflow];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Activity => "activity",
            TaskKind::Workflow => "workflow",
        }
    }
}

/// A state name that is not one of the enum's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState(pub String);

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown state {:?}", self.0)
    }
}

impl std::error::Error for UnknownState {}

macro_rules! text_enum {
    ($t:ty) => {
        impl FromStr for $t {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, UnknownState> {
                <$t>::ALL
                    .into_iter()
                    .find(|state| state.as_str() == s)
                    .ok_or_else(|| UnknownState(s.to_owned()))
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
text_enum!(TaskState);
text_enum!(ExecutionState);
text_enum!(TaskKind);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_name() {
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>(), Ok(s));
        }
        for s in ExecutionState::ALL {
            assert_eq!(s.as_str().parse::<ExecutionState>(), Ok(s));
            assert_eq!(s.to_string(), s.as_str());
        }
    }

    #[test]
    fn names_are_the_schemas() {
        // sql/schema.sql's CHECK on executions.state lists these, and its
        // comment on tasks.state gives their domain.
        let schema = include_str!("../../sql/schema.sql");
        for s in ExecutionState::ALL {
            assert!(schema.contains(&format!("'{}'", s.as_str())), "{s} in the schema");
        }
        for s in TaskState::ALL {
            assert!(
                schema.contains(&format!("--   {}: ", s.as_str())),
                "{s} in the schema"
            );
        }
    }

    #[test]
    fn active_states_are_running_suspended_paused() {
        let active: Vec<_> = ExecutionState::ALL
            .into_iter()
            .filter(|s| s.is_active())
            .collect();
        assert_eq!(
            active,
            [
                ExecutionState::Running,
                ExecutionState::Suspended,
                ExecutionState::Paused
            ]
        );
        assert!(ExecutionState::Migrated.is_migrating() && !ExecutionState::Migrated.is_active());
    }

    #[test]
    fn only_ready_and_running_hold_a_slot() {
        let holding: Vec<_> = TaskState::ALL.into_iter().filter(|s| s.holds_slot()).collect();
        assert_eq!(holding, [TaskState::Ready, TaskState::Running]);
    }

    #[test]
    fn an_unknown_name_is_an_error() {
        assert_eq!(
            "running".parse::<ExecutionState>(),
            Err(UnknownState("running".into()))
        );
        assert!("RUNNING".parse::<TaskState>().is_err());
    }
}
