//! Fan-out reads over executions: a page of every shard's executions merged
//! in `(created_at, execution_id)` order, and finding an execution by its
//! business key on whichever shard holds it. Every readable shard is asked;
//! one that cannot answer is named in the result, never silently skipped.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use sheaf_core::page::{Cursor, filter_hash, merge_sorted};
use sheaf_core::state::ExecutionState;

pub use sheaf_core::page::SortOrder;

use super::executions::{execution_from_row, read_state};
use super::{Call, Client, ClientError, Execution, Owned};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;

const LIST: &str = "SELECT execution_id, workflow_name, workflow_id, state, created_at, closed_at, parent_id, \
     search_attrs FROM sheaf.list_executions($1, $2, $3, $4)";
const UPSERT: &str = "SELECT sheaf.upsert_search_attrs($1, $2)";
const COUNT: &str = "SELECT state, count, capped FROM sheaf.count_executions($1, $2)";
const FIND: &str = "SELECT execution_id, workflow_name, workflow_id, state, input, result, error, \
     concurrency_key, quota_key, history_bytes, created_at, closed_at, wake_at \
     FROM sheaf.find_execution($1, $2)";

/// The largest page: each shard is asked for one row more, and a shard
/// returns at most 1,000.
pub const MAX_LIST_PAGE: usize = 999;

/// The largest bound on one shard's count of one state
/// ([`Client::count_executions`]).
pub const MAX_COUNT_CAP: u32 = 1_000_000;

/// An attribute comparison of [`ExecutionFilter::attr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttrOp {
    /// `=`: same JSON type and value.
    Eq,
    /// `!=`: present, same JSON type, another value.
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// `KEY=VALUE` (the command line's `--attr`, the dashboard's attribute
/// filter) as an equality on a search attribute: VALUE as JSON when it
/// parses as a string, number or boolean (`5` a number, `"5"` a string,
/// `true` a boolean), else the string it is. `None` without a `=`.
pub fn attr_equality(arg: &str) -> Option<(String, Value)> {
    let (key, raw) = arg.split_once('=')?;
    let value = match serde_json::from_str::<Value>(raw) {
        Ok(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => v,
        _ => Value::String(raw.to_owned()),
    };
    Some((key.to_owned(), value))
}

impl AttrOp {
    fn as_str(self) -> &'static str {
        match self {
            AttrOp::Eq => "=",
            AttrOp::Ne => "!=",
            AttrOp::Lt => "<",
            AttrOp::Le => "<=",
            AttrOp::Gt => ">",
            AttrOp::Ge => ">=",
        }
    }
}

/// Which executions a listing returns: the tests added are and-ed (none:
/// every execution); [`ExecutionFilter::from_json`] takes any tree the
/// shard's `list_executions` accepts (`or`, `not`, …). The shard checks it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutionFilter {
    parts: Vec<Value>,
}

impl ExecutionFilter {
    /// Every execution.
    pub fn new() -> ExecutionFilter {
        ExecutionFilter::default()
    }

    /// A filter tree as JSON (see the filter table in docs/reference/sql/executions.md), and-ed with
    /// what else is added.
    pub fn from_json(tree: Value) -> ExecutionFilter {
        ExecutionFilter::new().and(tree)
    }

    /// Also require `tree`.
    pub fn and(mut self, tree: Value) -> ExecutionFilter {
        if tree.as_object().is_none_or(|m| !m.is_empty()) {
            self.parts.push(tree);
        }
        self
    }

    /// Executions in one of `states`.
    pub fn states(self, states: impl IntoIterator<Item = ExecutionState>) -> ExecutionFilter {
        let states: Vec<&str> = states.into_iter().map(ExecutionState::as_str).collect();
        self.and(json!({ "state": states }))
    }

    /// Executions of one of `names`.
    pub fn workflows<S: Into<String>>(self, names: impl IntoIterator<Item = S>) -> ExecutionFilter {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        self.and(json!({ "workflow_name": names }))
    }

    /// Executions whose attribute `key` compares to `value` (typed: a
    /// number never matches a string).
    pub fn attr(self, key: &str, op: AttrOp, value: impl Into<Value>) -> ExecutionFilter {
        self.and(json!({ "attr": key, "op": op.as_str(), "value": value.into() }))
    }

    /// Executions whose attribute `key` is one of `values`.
    pub fn attr_in(self, key: &str, values: impl IntoIterator<Item = Value>) -> ExecutionFilter {
        let values: Vec<Value> = values.into_iter().collect();
        self.and(json!({ "attr": key, "op": "in", "value": values }))
    }

    /// Executions that have attribute `key`.
    pub fn attr_exists(self, key: &str) -> ExecutionFilter {
        self.and(json!({ "attr": key, "op": "exists" }))
    }

    /// Executions created after `at` (exclusive).
    pub fn created_after(self, at: SystemTime) -> ExecutionFilter {
        self.and(json!({ "created_after": rfc3339(at) }))
    }

    /// Executions created before `at` (exclusive).
    pub fn created_before(self, at: SystemTime) -> ExecutionFilter {
        self.and(json!({ "created_before": rfc3339(at) }))
    }

    /// The filter as the shard takes it.
    pub fn to_json(&self) -> Value {
        match self.parts.as_slice() {
            [] => json!({}),
            [one] => one.clone(),
            many => json!({ "and": many }),
        }
    }
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

/// One execution of a listing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ListedExecution {
    /// Its id.
    pub execution_id: ExecutionId,
    /// The shard that holds it.
    pub shard: ShardId,
    /// The workflow it runs.
    pub workflow_name: String,
    /// The caller's id for this run.
    pub workflow_id: String,
    /// Where it is in its life.
    pub state: ExecutionState,
    /// When it started (the listing's order, then `execution_id`).
    pub created_at: SystemTime,
    /// When it ended.
    pub closed_at: Option<SystemTime>,
    /// The execution that started it, if any.
    pub parent_id: Option<ExecutionId>,
    /// Its search attributes.
    pub search_attrs: Json,
}

/// Whether every readable shard answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageStatus {
    /// Every readable shard answered: nothing is missing.
    Complete,
    /// Some shard could not be asked or did not answer; its rows are
    /// missing, the others' are exact. See `unavailable_shards`.
    Partial,
}

/// One page of a listing across shards.
#[derive(Debug)]
#[non_exhaustive]
pub struct ExecutionPage {
    /// At most `page_size` executions, in order.
    pub items: Vec<ListedExecution>,
    /// The cursor of the next page; `None` when the answering shards had
    /// nothing after this page.
    pub next_cursor: Option<String>,
    /// `Partial` when a shard is missing from the page.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

/// Executions counted by state across shards ([`Client::count_executions`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct ExecutionCounts {
    /// Each state a listing shows, in [`ExecutionState::ALL`]'s order, summed
    /// over the shards that answered.
    pub counts: Vec<StateCount>,
    /// `Partial` when a shard is missing from the sums.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

/// One state's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateCount {
    /// The state.
    pub state: ExecutionState,
    /// How many, summed over the shards; with `capped`, at least this many.
    pub count: u64,
    /// Whether a shard had more than the cap in this state.
    pub capped: bool,
}

/// Where (name, workflow id) was found, across every readable shard.
#[derive(Debug)]
pub enum Resolution {
    /// The active run (else the most recently started ended one) of the
    /// shards that answered, and the shard that holds it.
    Found {
        /// The execution.
        execution: Box<Execution>,
        /// Its shard.
        shard: ShardId,
        /// Every other live run of the key, on other shards (each names its
        /// shard): a duplicate made by a misplaced start (see
        /// [`Admin::misplaced_runs`](crate::Admin::misplaced_runs)).
        /// Normally empty.
        also_live: Vec<Execution>,
    },
    /// Every readable shard answered, and none has it.
    Absent,
    /// Some shard could not answer: it may hold the execution. `ended` is
    /// the best ended run the others hold (an active run there would be
    /// `Found`: one active run per key).
    Indeterminate {
        /// An ended run found on the shards that answered, if any.
        ended: Option<Box<Execution>>,
        /// The shards that could not answer, and why.
        unavailable_shards: BTreeMap<ShardId, ClientError>,
    },
}

impl Client {
    /// Merges `attrs` into an active execution's search attributes (a null
    /// value removes the key); the merged attributes.
    pub async fn upsert_search_attrs(
        &self,
        id: ExecutionId,
        attrs: impl Into<Json>,
    ) -> Result<Json, ClientError> {
        let call = self.by_execution(id);
        let attrs = attrs.into();
        let rows = self.query(&call, UPSERT, &[&id.as_uuid(), &attrs]).await?;
        super::first_column(&call, &rows)
    }

    /// One page of the executions of every readable shard matching
    /// `filter`, in `order`, after `cursor` (`None`: the first page). Each
    /// shard is asked at once for `page_size + 1` rows after the cursor's
    /// anchor, and the rows are merged (memory: shards × page). Paging to
    /// the end lists every execution committed before the first page
    /// exactly once. A shard that cannot answer makes the page `Partial`;
    /// a filter or cursor the shard refuses is an error.
    pub async fn list_executions(
        &self,
        filter: &ExecutionFilter,
        cursor: Option<&str>,
        page_size: usize,
        order: SortOrder,
    ) -> Result<ExecutionPage, ClientError> {
        if page_size == 0 || page_size > MAX_LIST_PAGE {
            return Err(ClientError::BadRequest(format!(
                "page_size must be from 1 to {MAX_LIST_PAGE}, got {page_size}"
            )));
        }
        let tree = filter.to_json();
        let hash = filter_hash(&tree, order);
        let after = cursor.map(|text| anchor(text, order, hash)).transpose()?;
        let ask = (page_size + 1) as i32;
        let report = self
            .fan_out(self.readable_shards(), |shard| {
                let (tree, after) = (&tree, &after);
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Listing("listing executions"),
                    };
                    let rows = self
                        .query(&call, LIST, &[tree, after, &ask, &order.as_str()])
                        .await?;
                    rows.iter().map(|row| listed_from_row(&call, row)).collect()
                }
            })
            .await;
        refused_argument(&report.failed)?;
        let runs: Vec<Vec<ListedExecution>> = report.ok.into_values().collect();
        let mut items = merge_sorted(runs, order, page_size + 1, sort_key);
        let more = items.len() > page_size;
        items.truncate(page_size);
        let next_cursor = more.then(|| items.last()).flatten().map(|last| {
            let (created_micros, id) = sort_key(last);
            Cursor {
                order,
                created_micros,
                id,
                filter: hash,
            }
            .encode()
        });
        Ok(ExecutionPage {
            items,
            next_cursor,
            status: status(&report.failed),
            unavailable_shards: report.failed,
        })
    }

    /// The execution of (`name`, `workflow_id`), wherever it lives: every
    /// readable shard is asked (no first hit wins); an active run ranks
    /// first, then the most recently started ended one. When a shard could
    /// not answer, the result is `Indeterminate`, never `Absent`.
    pub async fn find_execution(&self, name: &str, workflow_id: &str) -> Result<Resolution, ClientError> {
        let (best, failed) = self.resolve_key(name, workflow_id).await?;
        Ok(match best {
            Some((e, also_live)) if e.state.is_active() || failed.is_empty() => Resolution::Found {
                shard: e.shard,
                execution: Box::new(e),
                also_live,
            },
            None if failed.is_empty() => Resolution::Absent,
            ended => Resolution::Indeterminate {
                ended: ended.map(|(e, _)| Box::new(e)),
                unavailable_shards: failed,
            },
        })
    }

    /// The best run of (`name`, `workflow_id`) the readable shards hold
    /// (active first, then the most recently started) with every other
    /// live run of the key elsewhere, and the shards that could not answer.
    pub(crate) async fn resolve_key(
        &self,
        name: &str,
        workflow_id: &str,
    ) -> Result<
        (
            Option<(Execution, Vec<Execution>)>,
            BTreeMap<ShardId, ClientError>,
        ),
        ClientError,
    > {
        let report = self
            .fan_out(self.readable_shards(), |shard| async move {
                let call = Call {
                    shard,
                    owned: Owned::Workflow {
                        name: name.to_owned(),
                        workflow_id: workflow_id.to_owned(),
                    },
                };
                let rows = self.query(&call, FIND, &[&name, &workflow_id]).await?;
                rows.first().map(|row| execution_from_row(&call, row)).transpose()
            })
            .await;
        refused_argument(&report.failed)?;
        let mut found: Vec<Execution> = report.ok.into_values().flatten().collect();
        // A moved run's live copy outranks its seal and its staged copy.
        found.sort_by_key(|e| {
            std::cmp::Reverse((
                e.state.is_active(),
                !e.state.is_migrating(),
                e.created_at,
                e.execution_id.as_uuid(),
            ))
        });
        let mut runs = found.into_iter();
        let best = runs.next().map(|best| {
            let also_live = runs
                .filter(|e| e.state.is_active() && !e.state.is_migrating())
                .filter(|e| e.execution_id != best.execution_id)
                .collect();
            (best, also_live)
        });
        Ok((best, report.failed))
    }
}

impl Client {
    /// The executions `filter` matches on every readable shard, counted by
    /// state (each state a listing shows) and summed: each shard counts at
    /// most `cap` (1..=[`MAX_COUNT_CAP`]) per state, so a count says
    /// `capped` when a shard had more (the sum is then a lower bound). One
    /// call per shard (`sheaf.count_executions`); a shard that cannot
    /// answer (or, during a rollout, is still on schema 0.2.0, which has no
    /// such function) makes the answer `Partial`, named in
    /// `unavailable_shards`; a filter the shard refuses is an error.
    pub async fn count_executions(
        &self,
        filter: &ExecutionFilter,
        cap: u32,
    ) -> Result<ExecutionCounts, ClientError> {
        if cap == 0 || cap > MAX_COUNT_CAP {
            return Err(ClientError::BadRequest(format!(
                "cap must be from 1 to {MAX_COUNT_CAP}, got {cap}"
            )));
        }
        let tree = filter.to_json();
        let cap = cap as i32;
        let report = self
            .fan_out(self.readable_shards(), |shard| {
                let tree = &tree;
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Listing("counting executions"),
                    };
                    let rows = self.query(&call, COUNT, &[tree, &cap]).await?;
                    rows.iter()
                        .map(|row| {
                            let state = read_state(&call, row)?;
                            let read = || -> Result<(i64, bool), tokio_postgres::Error> {
                                Ok((row.try_get("count")?, row.try_get("capped")?))
                            };
                            let (count, capped) = read().map_err(|e| call.error(e, 1))?;
                            Ok((state, count, capped))
                        })
                        .collect::<Result<Vec<_>, ClientError>>()
                }
            })
            .await;
        refused_argument(&report.failed)?;
        let mut counts: Vec<StateCount> = ExecutionState::ALL
            .iter()
            .filter(|s| !s.is_migrating())
            .map(|&state| StateCount {
                state,
                count: 0,
                capped: false,
            })
            .collect();
        for (state, count, capped) in report.ok.into_values().flatten() {
            if let Some(c) = counts.iter_mut().find(|c| c.state == state) {
                c.count += u64::try_from(count).unwrap_or(0);
                c.capped |= capped;
            }
        }
        Ok(ExecutionCounts {
            counts,
            status: status(&report.failed),
            unavailable_shards: report.failed,
        })
    }
}

/// A fan-out read's argument that a shard refused (22023, 22004) is the
/// caller's mistake, the same on every shard: an error, not a missing shard.
pub(crate) fn refused_argument(failed: &BTreeMap<ShardId, ClientError>) -> Result<(), ClientError> {
    // The shard's message alone: "invalid request: invalid argument: ..."
    // would say one thing twice.
    match failed.values().find_map(|e| match e {
        ClientError::InvalidArgument { message, .. } => Some(message),
        _ => None,
    }) {
        Some(message) => Err(ClientError::BadRequest(message.clone())),
        None => Ok(()),
    }
}

pub(crate) fn status(failed: &BTreeMap<ShardId, ClientError>) -> PageStatus {
    if failed.is_empty() {
        PageStatus::Complete
    } else {
        PageStatus::Partial
    }
}

/// The order key of a listed row: microseconds since the epoch (what the
/// shard stores), then the id.
fn sort_key(e: &ListedExecution) -> (i64, uuid::Uuid) {
    (micros(e.created_at), e.execution_id.as_uuid())
}

fn micros(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

fn from_micros(micros: i64) -> SystemTime {
    let d = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// The shard's `after` anchor of a cursor, which must come from a listing
/// with the same filter and order.
fn anchor(text: &str, order: SortOrder, hash: u64) -> Result<Json, ClientError> {
    let cursor = Cursor::decode(text).map_err(|e| ClientError::BadRequest(e.to_string()))?;
    if cursor.order != order {
        return Err(ClientError::BadRequest(format!(
            "the cursor is from a listing in {} order, this one is {}",
            cursor.order.as_str(),
            order.as_str()
        )));
    }
    if cursor.filter != hash {
        return Err(ClientError::BadRequest(
            "the cursor is from a listing with another filter".into(),
        ));
    }
    let mut m = Map::new();
    m.insert(
        "created_at".into(),
        rfc3339(from_micros(cursor.created_micros)).into(),
    );
    m.insert("execution_id".into(), cursor.id.to_string().into());
    Ok(Json::from(Value::Object(m)))
}

fn listed_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<ListedExecution, ClientError> {
    let state = read_state(call, row)?;
    let read = || -> Result<ListedExecution, tokio_postgres::Error> {
        Ok(ListedExecution {
            execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
            shard: call.shard,
            workflow_name: row.try_get("workflow_name")?,
            workflow_id: row.try_get("workflow_id")?,
            state,
            created_at: row.try_get("created_at")?,
            closed_at: row.try_get("closed_at")?,
            parent_id: row
                .try_get::<_, Option<uuid::Uuid>>("parent_id")?
                .map(ExecutionId::from_uuid),
            search_attrs: row.try_get("search_attrs")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attr_equality_value_is_json_when_it_parses_else_a_string() {
        assert_eq!(attr_equality("n=5").unwrap(), ("n".into(), json!(5)));
        assert_eq!(attr_equality("n=\"5\"").unwrap(), ("n".into(), json!("5")));
        assert_eq!(attr_equality("vip=true").unwrap(), ("vip".into(), json!(true)));
        assert_eq!(attr_equality("t=acme").unwrap(), ("t".into(), json!("acme")));
        assert_eq!(attr_equality("t=[1]").unwrap(), ("t".into(), json!("[1]")));
        assert_eq!(attr_equality("t=a=b").unwrap(), ("t".into(), json!("a=b")));
        assert!(attr_equality("nothing").is_none());
    }

    #[test]
    fn a_filter_is_its_parts_anded() {
        assert_eq!(ExecutionFilter::new().to_json(), json!({}));
        let f = ExecutionFilter::new().states([ExecutionState::Running]);
        assert_eq!(f.to_json(), json!({"state": ["RUNNING"]}));
        let f = f.attr("tenant", AttrOp::Eq, "acme").attr_exists("vip");
        assert_eq!(
            f.to_json(),
            json!({"and": [
                {"state": ["RUNNING"]},
                {"attr": "tenant", "op": "=", "value": "acme"},
                {"attr": "vip", "op": "exists"}
            ]})
        );
        assert_eq!(ExecutionFilter::from_json(json!({})).to_json(), json!({}));
    }

    #[test]
    fn micros_round_trip_and_format_exactly() {
        for m in [0i64, 1, 1_733_000_000_123_456, -1_500_000] {
            assert_eq!(micros(from_micros(m)), m);
        }
        assert_eq!(rfc3339(from_micros(1_500_000)), "1970-01-01T00:00:01.500000Z");
    }

    #[test]
    fn a_cursor_is_bound_to_its_filter_and_order() {
        let hash = filter_hash(&json!({}), SortOrder::Desc);
        let text = Cursor {
            order: SortOrder::Desc,
            created_micros: 1_500_000,
            id: uuid::Uuid::nil(),
            filter: hash,
        }
        .encode();
        let a = anchor(&text, SortOrder::Desc, hash).unwrap();
        assert_eq!(
            a.to_value().unwrap(),
            json!({"created_at": "1970-01-01T00:00:01.500000Z", "execution_id": uuid::Uuid::nil().to_string()})
        );
        assert!(anchor(&text, SortOrder::Asc, hash).is_err());
        assert!(anchor(&text, SortOrder::Desc, hash ^ 1).is_err());
        assert!(anchor("garbage", SortOrder::Desc, hash).is_err());
    }
}
