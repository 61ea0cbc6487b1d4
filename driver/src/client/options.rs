//! `EnqueueOptions` and `StartOptions`: typed builders for what
//! `sheaf.enqueue` and `sheaf.start_workflow` take as `jsonb` options (SQL
//! callers keep the JSON form). Each starts empty, which means the shard's
//! defaults; the shard validates every value and refuses a bad one (22023).

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};
use sheaf_core::state::TaskKind;

use crate::id::ExecutionId;
use crate::router::Placement;

/// How to enqueue a task. `EnqueueOptions::new()` takes the defaults.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct EnqueueOptions {
    pub(crate) priority: Option<i32>,
    pub(crate) run_at: Option<SystemTime>,
    pub(crate) concurrency_key: Option<String>,
    pub(crate) fairness_key: Option<String>,
    pub(crate) fairness_weight: Option<f64>,
    pub(crate) max_attempts: Option<i32>,
    pub(crate) execution: Option<ExecutionId>,
    pub(crate) kind: Option<TaskKind>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) rate_limit: Option<String>,
    pub(crate) rate_key: Option<String>,
    pub(crate) placement: Option<Placement>,
}

impl EnqueueOptions {
    /// The shard's defaults: priority 0, due now, 25 attempts, no keys.
    pub fn new() -> EnqueueOptions {
        EnqueueOptions::default()
    }

    /// Higher runs first (default 0).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Not claimable before `at`.
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Counts toward this key's cap (`sheaf.set_concurrency_limit`).
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Shares the queue fairly with other keys (a queue with `fairness` on).
    pub fn fairness_key(mut self, key: impl Into<String>) -> Self {
        self.fairness_key = Some(key.into());
        self
    }

    /// This key's share relative to others (0.001..1000, default 1).
    pub fn fairness_weight(mut self, weight: f64) -> Self {
        self.fairness_weight = Some(weight);
        self
    }

    /// Attempts before it is dead-lettered (1..1000, default 25).
    pub fn max_attempts(mut self, attempts: i32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// A task of this execution: it goes to the execution's shard, and its
    /// result goes to the execution's history. Takes no placement.
    pub fn execution(mut self, id: ExecutionId) -> Self {
        self.execution = Some(id);
        self
    }

    /// An activity (default) or a workflow task.
    pub fn kind(mut self, kind: TaskKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// While a task with this key is unfinished, enqueueing again returns
    /// its id and writes nothing. Places the task by (queue, key), so the
    /// duplicate meets its first copy on the same shard.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Waits on rate limit `name` (`sheaf.declare_rate_limit`): the task is
    /// admitted when its bucket has a token for it, in order per bucket.
    pub fn rate_limit(mut self, name: impl Into<String>) -> Self {
        self.rate_limit = Some(name.into());
        self
    }

    /// Its bucket's key (over the limit's key path). Places the task by
    /// (limit, key) unless an idempotency key or a placement says
    /// otherwise: buckets are per shard, so one key's tasks share one.
    pub fn rate_key(mut self, key: impl Into<String>) -> Self {
        self.rate_key = Some(key.into());
        self
    }

    /// The (name, key) an automatic placement hashes: (queue, idempotency
    /// key), else (`rate:<limit>`, rate key).
    pub(crate) fn affinity(&self, queue: &str) -> Option<(String, String)> {
        match (&self.idempotency_key, &self.rate_limit, &self.rate_key) {
            (Some(k), _, _) => Some((queue.to_owned(), k.clone())),
            (None, Some(limit), Some(k)) => Some((format!("rate:{limit}"), k.clone())),
            _ => None,
        }
    }

    /// Where a task with no execution goes (default: any writable shard, or
    /// by its idempotency key or rate key).
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    /// The `opts` of `sheaf.enqueue`, without `run_at` (sent as a
    /// timestamptz parameter, so no clock text is formatted here).
    pub(crate) fn to_sql_opts(&self) -> Value {
        let mut m = Map::new();
        put(&mut m, "priority", self.priority);
        put(&mut m, "concurrency_key", self.concurrency_key.clone());
        put(&mut m, "fairness_key", self.fairness_key.clone());
        put(&mut m, "fairness_weight", self.fairness_weight);
        put(&mut m, "max_attempts", self.max_attempts);
        put(&mut m, "execution_id", self.execution.map(|id| id.to_string()));
        put(&mut m, "kind", self.kind.map(|k| k.as_str()));
        put(&mut m, "idempotency_key", self.idempotency_key.clone());
        put(&mut m, "rate_limit", self.rate_limit.clone());
        put(&mut m, "rate_key", self.rate_key.clone());
        Value::Object(m)
    }
}

/// How to start a workflow. `StartOptions::new()` takes the defaults.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct StartOptions {
    pub(crate) placement: Option<Placement>,
    pub(crate) tenant: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i32>,
    pub(crate) run_at: Option<SystemTime>,
    pub(crate) search_attrs: Map<String, Value>,
    pub(crate) execution_timeout: Option<Duration>,
    pub(crate) debounce: Option<(String, Duration, DebounceMode)>,
}

/// Which start of a burst a debounced start keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DebounceMode {
    /// The run starts once the burst is over (a window after the last
    /// start), with the last start's input.
    Trailing,
    /// The run starts at the first start; later ones in the window join it.
    Leading,
}

impl DebounceMode {
    /// Its word: `trailing` or `leading`.
    pub fn as_str(self) -> &'static str {
        match self {
            DebounceMode::Trailing => "trailing",
            DebounceMode::Leading => "leading",
        }
    }
}

impl crate::words::Words for DebounceMode {
    fn from_word(word: &str) -> Option<Self> {
        [DebounceMode::Trailing, DebounceMode::Leading]
            .into_iter()
            .find(|mode| mode.as_str() == word)
    }
}

impl StartOptions {
    /// Placed by (name, workflow id), on the workflow's declared queue, due now.
    pub fn new() -> StartOptions {
        StartOptions::default()
    }

    /// A routing key, shard or residency key (default: automatic).
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    /// On behalf of an ambient tenant: an automatic placement then routes
    /// by `tenant__<tenant>__<name>`, so all of a tenant's executions of one
    /// workflow share a shard; an explicit placement still wins.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The queue of its first workflow task (default: the declared one).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// A search attribute set at the start (a string, number or boolean;
    /// at most 64 per execution, 16 KB in all), for
    /// [`Client::list_executions`](crate::Client::list_executions) filters.
    pub fn search_attr(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.search_attrs.insert(key.into(), value.into());
        self
    }

    /// The priority of its first workflow task.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// When its first workflow task is due.
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// The run ends `TIMED_OUT` this long after its start (whole seconds,
    /// from 1 second to 10 years; `sheaf.maintain` ends it, so within a
    /// maintenance interval of the deadline). A successor of continue-as-new
    /// keeps its predecessor's deadline.
    pub fn execution_timeout(mut self, timeout: Duration) -> Self {
        self.execution_timeout = Some(timeout);
        self
    }

    /// Debounces the start: one pending start per (workflow, `key`), so a
    /// burst of starts within `window` (10 ms to 1 day) of each other makes
    /// one run, whose id every start of the burst returns (`created` only
    /// for the first). Routed by `key` (every start of a key meets on one
    /// shard), so it takes no placement or tenant, and no `run_at`.
    pub fn debounce(mut self, key: impl Into<String>, window: Duration, mode: DebounceMode) -> Self {
        self.debounce = Some((key.into(), window, mode));
        self
    }

    /// The `opts` of `sheaf.start_workflow` with the minted id, without
    /// `run_at` (a timestamptz parameter).
    pub(crate) fn to_sql_opts(&self, execution_id: ExecutionId) -> Value {
        let mut m = Map::new();
        m.insert("execution_id".into(), execution_id.to_string().into());
        put(&mut m, "queue", self.queue.clone());
        put(&mut m, "priority", self.priority);
        // Rounded up: a timeout under a second is not refused as "0s".
        put(
            &mut m,
            "execution_timeout",
            self.execution_timeout
                .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
        );
        if !self.search_attrs.is_empty() {
            m.insert("search_attrs".into(), Value::Object(self.search_attrs.clone()));
        }
        if let Some((key, window, mode)) = &self.debounce {
            // Milliseconds, as humantime reads them: the window is not rounded.
            m.insert(
                "debounce".into(),
                serde_json::json!({"key": key, "window": format!("{}ms", window.as_millis()), "mode": mode.as_str()}),
            );
        }
        Value::Object(m)
    }
}

/// `opts.placement` as shards since 0.3.0 read it and check (`shard`,
/// `residency_key`, `routing_key`, `tenant`); `None` for an automatic
/// placement without a tenant, the shard's own default.
pub(crate) fn placement_opt(placement: Option<&Placement>, tenant: Option<&str>) -> Option<Value> {
    let mut m = Map::new();
    match placement {
        None | Some(Placement::Auto) => {}
        Some(Placement::Shard(id)) => {
            m.insert("shard".into(), id.get().into());
        }
        Some(Placement::ResidencyKey(k)) => {
            m.insert("residency_key".into(), k.as_str().into());
        }
        Some(Placement::RoutingKey(k)) => {
            m.insert("routing_key".into(), k.as_str().into());
        }
    }
    put(&mut m, "tenant", tenant);
    (!m.is_empty()).then_some(Value::Object(m))
}

fn put(m: &mut Map<String, Value>, name: &str, value: Option<impl Into<Value>>) {
    if let Some(v) = value {
        m.insert(name.to_owned(), v.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ShardId;

    #[test]
    fn a_placement_is_sent_as_the_shards_read_it() {
        assert_eq!(placement_opt(None, None), None);
        assert_eq!(placement_opt(Some(&Placement::Auto), None), None);
        assert_eq!(
            placement_opt(Some(&Placement::Auto), Some("acme")),
            Some(serde_json::json!({"tenant": "acme"}))
        );
        let shard = ShardId::new(3).unwrap();
        assert_eq!(
            placement_opt(Some(&Placement::Shard(shard)), None),
            Some(serde_json::json!({"shard": 3}))
        );
        assert_eq!(
            placement_opt(Some(&Placement::RoutingKey("k".into())), Some("t")),
            Some(serde_json::json!({"routing_key": "k", "tenant": "t"}))
        );
        assert_eq!(
            placement_opt(Some(&Placement::ResidencyKey("eu".into())), None),
            Some(serde_json::json!({"residency_key": "eu"}))
        );
    }

    #[test]
    fn empty_options_are_the_shard_defaults() {
        assert_eq!(EnqueueOptions::new().to_sql_opts(), serde_json::json!({}));
        let id = ExecutionId::mint(ShardId::new(1).unwrap()).unwrap();
        assert_eq!(
            StartOptions::new().to_sql_opts(id),
            serde_json::json!({ "execution_id": id.to_string() })
        );
    }

    #[test]
    fn every_option_reaches_the_json_by_its_sql_name() {
        let id = ExecutionId::mint(ShardId::new(2).unwrap()).unwrap();
        let o = EnqueueOptions::new()
            .priority(5)
            .concurrency_key("k")
            .fairness_key("f")
            .fairness_weight(2.5)
            .max_attempts(3)
            .execution(id)
            .kind(TaskKind::Workflow)
            .idempotency_key("i");
        assert_eq!(
            o.to_sql_opts(),
            serde_json::json!({
                "priority": 5, "concurrency_key": "k", "fairness_key": "f",
                "fairness_weight": 2.5, "max_attempts": 3, "execution_id": id.to_string(),
                "kind": "workflow", "idempotency_key": "i"
            })
        );
        let s = StartOptions::new().queue("q").priority(-1).to_sql_opts(id);
        assert_eq!(s["queue"], "q");
        assert_eq!(s["priority"], -1);
    }
}
