//! The one way the queue layer reaches executions.
//!
//! A task may belong to an execution (`tasks.execution_id`). The queue never
//! names workflow code: where a task's life matters to its execution, the
//! queue function takes `&dyn ExecutionIntake` (enqueueing: may it take a
//! task?) or `&dyn ExecutionHooks` (what became of its task) and calls it,
//! in the same transaction and at the point the lists below say. The
//! workflow layer implements them (`workflow::executions::INTAKE`, which
//! reads an execution's state only, and `workflow::hooks::EXECUTIONS`, which
//! may end the execution); the api layer passes them in. So a signature
//! says it: a function without either parameter never touches an execution.

/// What became of a task of an execution.
pub enum Outcome<'a> {
    /// Completed by its worker; `result` as given.
    Completed { result: Option<serde_json::Value> },
    /// A failed attempt that will be retried.
    Failed { attempt: i32, error: &'a str },
    /// Its attempts ran out (a failure or an expired lease): it is a dead
    /// letter now.
    DeadLettered { attempts: i32, error: &'a str },
    /// Its lease expired with attempts left (its worker crashed or
    /// stalled): the attempt is spent and the task back in line.
    Reaped { attempt: i32 },
    /// An operator cancelled it (`sheaf.cancel_task`): gone now, or, if it
    /// was running, once its holder gives it back or its lease ends.
    Cancelled { reason: Option<&'a str> },
}

/// One task's outcome, reported to its execution.
pub struct TaskEvent<'a> {
    pub execution_id: pgrx::Uuid,
    pub task_id: pgrx::Uuid,
    /// `workflow` or `activity`.
    pub kind: &'a str,
    pub outcome: Outcome<'a>,
    /// The attempt's seconds from its claim to this outcome (for a reaped
    /// one, to its lease's end); `None` for a task claimed by a library
    /// older than its catalog's `claimed_at` (`tasks::claim_times`).
    pub secs: Option<f64>,
}

/// How an execution takes a new task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// In line as usual.
    Open,
    /// Parked, holding no slot, until the execution resumes.
    Parked,
}

/// What the queue asks of the execution a new task is for.
pub trait ExecutionIntake {
    /// Whether execution `id` takes a new task, and how; raises (P0002 for
    /// an unknown id, 55000 for an ended one) if it takes none. Called
    /// before the task is written.
    fn intake(&self, id: pgrx::Uuid) -> Intake;
}

/// What the queue tells the execution a task belongs to.
pub trait ExecutionHooks {
    /// A task of an execution reached an outcome. Called after the task row
    /// changed (it is still locked) and before its concurrency slot is
    /// released: the execution row comes after task rows and before
    /// concurrency keys in the lock order (`base::locks`).
    fn task_outcome(&self, event: TaskEvent<'_>);

    /// Dead letters of these executions (one entry per dead letter) left
    /// the dead letters: redriven back in line, or purged.
    fn dead_letters_gone(&self, execution_ids: &[pgrx::Uuid]);
}
