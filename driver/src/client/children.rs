//! Child workflows: placed here (the parent's shard decides nothing), started
//! in the parent's shard transaction (`sheaf.start_child`), cancelled by the
//! parent, and read back across every shard as a list or a tree.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::SystemTime;

use sheaf_core::hrw;
use sheaf_core::state::ExecutionState;

use super::search::{PageStatus, refused_argument, status};
use super::{Admin, Call, Client, ClientError, Owned, first_column, single};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::pool::ShardError;
use crate::router::RouteError;
use crate::topology::ShardId;

const START_CHILD: &str = "SELECT child_id, target_shard, created FROM sheaf.start_child($1, $2, $3, $4, $5)";
const CANCEL_CHILD: &str = "SELECT sheaf.cancel_child($1, $2, $3)";
const LIST_CHILDREN: &str = "SELECT execution_id, workflow_name, workflow_id, state, shard, created_at, closed_at \
     FROM sheaf.list_children($1, $2, $3)";
const LINKS: &str = "SELECT parent_id, child_id, workflow_name, workflow_id, state, created_at \
     FROM sheaf.list_child_links($1, $2, $3)";
const KNOWN: &str = "SELECT known FROM sheaf.known_children($1) AS known";
/// One `list_children` page.
const CHILDREN_PAGE: i32 = 1000;
/// The most children [`Client::children`] reads of one parent, and the
/// most nodes [`Client::tree`] reads.
pub const MAX_CHILDREN: usize = 100_000;

/// Where a child runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChildPlacement {
    /// On the shard its parent lives on (the default; after a move, the
    /// parent's new home, not the shard its id names): the router is not
    /// consulted, and the child starts in the parent's transaction.
    #[default]
    ParentShard,
    /// Spread by rendezvous hashing of `"{parent_id}#{name}#{workflow_id}"`
    /// over the writable, unreserved shards: a retried spawn lands on the
    /// same shard. With no such shard (a fully drained fleet) the child
    /// stays on its parent's shard, with a warning.
    Distributed,
    /// On this shard, which must be writable.
    Shard(ShardId),
    /// On the shard this residency key is declared for.
    ResidencyKey(String),
}

/// What a parent's end does to a child that is still running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParentClose {
    /// It is terminated (the default).
    #[default]
    Terminate,
    /// It is cancelled.
    RequestCancel,
    /// It runs on, on its own.
    Abandon,
}

impl ParentClose {
    fn as_str(self) -> &'static str {
        match self {
            ParentClose::Terminate => "terminate",
            ParentClose::RequestCancel => "request_cancel",
            ParentClose::Abandon => "abandon",
        }
    }
}

/// How [`Client::start_child`] starts a child: a [`ChildPlacement`] converts
/// into it. `ChildOptions::new()` takes the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChildOptions {
    pub(crate) placement: ChildPlacement,
    pub(crate) parent_close: ParentClose,
}

impl From<ChildPlacement> for ChildOptions {
    fn from(placement: ChildPlacement) -> ChildOptions {
        ChildOptions {
            placement,
            ..ChildOptions::default()
        }
    }
}

impl ChildOptions {
    /// The defaults (as [`Default`]).
    pub fn new() -> ChildOptions {
        ChildOptions::default()
    }

    /// Where it runs.
    pub fn placement(mut self, placement: ChildPlacement) -> Self {
        self.placement = placement;
        self
    }

    /// What its parent's end does to it.
    pub fn parent_close(mut self, parent_close: ParentClose) -> Self {
        self.parent_close = parent_close;
        self
    }
}

/// A child [`Client::start_child`] started (or had started before).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartedChild {
    /// The child's execution id (it names the shard it was started on).
    pub child_id: ExecutionId,
    /// The shard it lives on (a repeated start: where it lives now).
    pub shard: ShardId,
    /// `false`: the same (parent, name, workflow id) started it before.
    pub created: bool,
}

/// A child, as one of its shards lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Child {
    /// Its execution id.
    pub execution_id: ExecutionId,
    /// Its shard.
    pub shard: ShardId,
    /// The workflow it runs.
    pub workflow_name: String,
    /// The parent's id for it.
    pub workflow_id: String,
    /// Its state; `None` while the relay has yet to start it on its shard.
    pub state: Option<ExecutionState>,
    /// When it was started (asked for, while `state` is `None`).
    pub created_at: SystemTime,
    /// When it ended.
    pub closed_at: Option<SystemTime>,
}

/// A parent's children, read from every readable shard.
#[derive(Debug)]
#[non_exhaustive]
pub struct Children {
    /// In the order they were started.
    pub items: Vec<Child>,
    /// `Partial` when a shard could not answer: its children are missing.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

/// A node of a tree: a child, and its parent in the tree.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TreeNode {
    /// The child.
    pub child: Child,
    /// Its parent (the root, or a node before it).
    pub parent: ExecutionId,
    /// 1 for the root's children, 2 for theirs, …
    pub depth: usize,
}

/// Every descendant of an execution, read from every readable shard.
#[derive(Debug)]
#[non_exhaustive]
pub struct Tree {
    /// The root.
    pub root: ExecutionId,
    /// The shard the root lives on (not its id's, if it moved); `None` if
    /// no shard has it.
    pub root_shard: Option<ShardId>,
    /// Breadth first: a node's parent comes before it.
    pub nodes: Vec<TreeNode>,
    /// `Partial` when a shard could not answer for some node.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

/// A child whose parent-side record is gone ([`Admin::orphan_children`](crate::Admin::orphan_children)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Orphan {
    /// The child.
    pub execution_id: ExecutionId,
    /// Its shard.
    pub shard: ShardId,
    /// The parent it names.
    pub parent_id: ExecutionId,
    /// Its workflow.
    pub workflow_name: String,
    /// Its workflow id.
    pub workflow_id: String,
    /// Its state.
    pub state: ExecutionState,
    /// When it started.
    pub created_at: SystemTime,
}

/// What [`Admin::orphan_children`](crate::Admin::orphan_children) found.
#[derive(Debug)]
#[non_exhaustive]
pub struct Orphans {
    /// The orphans of the shards that answered (children and parents both).
    pub items: Vec<Orphan>,
    /// `Partial` when a shard could not answer: its children were not
    /// listed, or the children naming a parent there were not checked.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

impl Client {
    /// Starts child `name`/`workflow_id` of `parent` with `input`, placed by
    /// `options` (a [`ChildPlacement`], or [`ChildOptions`]), in one
    /// transaction on the parent's shard: there it starts at once; on
    /// another shard the relay starts it (every `Worker` runs one). The
    /// parent's history gets `ChildStarted`. Again for the same (parent,
    /// name, workflow id) it returns the same child (`created = false`),
    /// wherever placement would put it now. A target this client has no pool
    /// for is [`ShardError::NoPool`] (retryable), and nothing is written.
    pub async fn start_child(
        &self,
        parent: ExecutionId,
        name: &str,
        workflow_id: &str,
        input: impl Into<Json>,
        options: impl Into<ChildOptions>,
    ) -> Result<StartedChild, ClientError> {
        let options = options.into();
        let call = self.by_execution(parent);
        let target = self.child_target(parent, name, workflow_id, &options.placement)?;
        // `ParentShard` names no shard: the parent's shard is where the
        // parent lives, which only the shard that holds it knows (its id
        // names where it was born; the call follows the forwards there).
        let opts = match target {
            Some(target) => serde_json::json!({
                "target_shard": target.get(),
                "parent_close": options.parent_close.as_str(),
            }),
            None => serde_json::json!({"parent_close": options.parent_close.as_str()}),
        };
        let opts = Json::from_serialize(&opts).map_err(|e| ClientError::BadRequest(e.to_string()))?;
        let input = input.into();
        let (answered, rows) = self
            .query_followed(
                &call,
                START_CHILD,
                &[&parent.as_uuid(), &name, &workflow_id, &input, &opts],
            )
            .await?;
        let call = Call {
            shard: answered,
            ..call
        };
        let row = single(&call, &rows)?;
        let read = || -> Result<StartedChild, tokio_postgres::Error> {
            let child = ExecutionId::from_uuid(row.try_get("child_id")?);
            let shard: i32 = row.try_get("target_shard")?;
            Ok(StartedChild {
                child_id: child,
                shard: ShardId::new(shard as u32).unwrap_or(answered),
                created: row.try_get("created")?,
            })
        };
        let started = read().map_err(|e| call.error(e, 1))?;
        if started.created {
            return Ok(started);
        }
        // A repeated start names the shard the child was started on; it
        // may have moved since: where it lives (one more read, repeats
        // only; a child the relay has yet to start stays at its target).
        let start = match self.topology.get(started.shard) {
            Some(_) => started.shard,
            None => started.child_id.route(&self.topology),
        };
        if self.topology.get(start).is_none() {
            return Ok(started);
        }
        let shard = self.residence(start, started.child_id).await?;
        Ok(StartedChild { shard, ..started })
    }

    /// The shard a new child goes to; `None`: its parent's (wherever the
    /// parent lives).
    fn child_target(
        &self,
        parent: ExecutionId,
        name: &str,
        workflow_id: &str,
        placement: &ChildPlacement,
    ) -> Result<Option<ShardId>, ClientError> {
        let t = &self.topology;
        let target = match placement {
            ChildPlacement::ParentShard => None,
            ChildPlacement::Distributed => {
                let key = format!("{}#{name}#{workflow_id}", parent.as_uuid());
                let h = hrw::key_hash(key.as_bytes());
                let picked =
                    hrw::pick(h, t.placeable().map(|s| s.get())).and_then(|s| ShardId::new(s as u32).ok());
                if picked.is_none() {
                    tracing::warn!(
                        workflow_name = name,
                        "no writable unreserved shard: a Distributed child stays on its parent's shard"
                    );
                }
                picked
            }
            ChildPlacement::Shard(id) => {
                if t.get(*id).is_none() {
                    return Err(ClientError::Shard {
                        owned: Owned::Execution(parent),
                        error: ShardError::NoPool { shard: *id },
                    });
                }
                if !t.is_writable(*id) {
                    return Err(RouteError::ShardNotWritable(*id).into());
                }
                Some(*id)
            }
            ChildPlacement::ResidencyKey(key) => {
                if key.trim().is_empty() {
                    return Err(RouteError::BlankResidencyKey.into());
                }
                let id = t
                    .residency(key)
                    .ok_or_else(|| RouteError::UndeclaredResidencyKey(key.clone()))?;
                if !t.is_writable(id) {
                    return Err(RouteError::ShardNotWritable(id).into());
                }
                Some(id)
            }
        };
        Ok(target)
    }

    /// Cancels `parent`'s child `child`: at once on the parent's shard, by
    /// the relay on another (its end then reaches the parent's history as
    /// `ChildCancelled`). `false` if it had ended.
    pub async fn cancel_child(
        &self,
        parent: ExecutionId,
        child: ExecutionId,
        reason: Option<&str>,
    ) -> Result<bool, ClientError> {
        let call = self.by_execution(parent);
        let rows = self
            .query(
                &call,
                CANCEL_CHILD,
                &[&parent.as_uuid(), &child.as_uuid(), &reason],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// `parent`'s children, from every readable shard, in the order they
    /// were started (at most [`MAX_CHILDREN`]). A shard that cannot answer
    /// makes the list `Partial` and is named; the rest is exact.
    pub async fn children(&self, parent: ExecutionId) -> Result<Children, ClientError> {
        let report = self
            .fan_out(self.readable_shards(), |shard| self.children_on(shard, parent))
            .await;
        refused_argument(&report.failed)?;
        // A child the relay just started is on its shard and still
        // `STARTING` on its parent's for a moment: the execution wins.
        let mut by_id: BTreeMap<ExecutionId, Child> = BTreeMap::new();
        for child in report.ok.into_values().flatten() {
            match by_id.get(&child.execution_id) {
                Some(seen) if seen.state.is_some() => {}
                _ => {
                    by_id.insert(child.execution_id, child);
                }
            }
        }
        let mut items: Vec<Child> = by_id.into_values().collect();
        items.sort_by_key(|c| (c.created_at, c.execution_id));
        items.truncate(MAX_CHILDREN);
        Ok(Children {
            items,
            status: status(&report.failed),
            unavailable_shards: report.failed,
        })
    }

    /// Every descendant of `root`, breadth first (at most [`MAX_CHILDREN`]
    /// nodes), each level read from every readable shard.
    pub async fn tree(&self, root: ExecutionId) -> Result<Tree, ClientError> {
        let mut nodes = Vec::new();
        let mut failed = BTreeMap::new();
        let mut queue = VecDeque::from([(root, 0usize)]);
        let mut seen = BTreeSet::from([root]);
        while let Some((parent, depth)) = queue.pop_front() {
            let children = self.children(parent).await?;
            failed.extend(children.unavailable_shards);
            for child in children.items {
                if nodes.len() >= MAX_CHILDREN {
                    break;
                }
                if seen.insert(child.execution_id) {
                    queue.push_back((child.execution_id, depth + 1));
                    nodes.push(TreeNode {
                        child,
                        parent,
                        depth: depth + 1,
                    });
                }
            }
        }
        let root_shard = self.get_execution(root).await?.map(|e| e.shard);
        Ok(Tree {
            root,
            root_shard,
            nodes,
            status: status(&failed),
            unavailable_shards: failed,
        })
    }

    /// Those of `links` (children of parents whose ids route to `home`)
    /// that the shard where their parent lives does not know. Only a
    /// parent `home` does not know costs a lookup of its residence.
    async fn unknown_where_parents_live(
        &self,
        home: ShardId,
        links: Vec<Orphan>,
    ) -> Result<Vec<Orphan>, (ShardId, ClientError)> {
        let unknown = self.unknown_on(home, links).await.map_err(|e| (home, e))?;
        let mut by_residence: BTreeMap<ShardId, Vec<Orphan>> = BTreeMap::new();
        let mut orphans = Vec::new();
        let mut residences: BTreeMap<ExecutionId, ShardId> = BTreeMap::new();
        for link in unknown {
            let lives = match residences.get(&link.parent_id) {
                Some(s) => *s,
                None => {
                    let s = self
                        .residence(home, link.parent_id)
                        .await
                        .map_err(|e| (home, e))?;
                    residences.insert(link.parent_id, s);
                    s
                }
            };
            if lives == home {
                orphans.push(link);
            } else {
                by_residence.entry(lives).or_default().push(link);
            }
        }
        for (lives, links) in by_residence {
            orphans.extend(self.unknown_on(lives, links).await.map_err(|e| (lives, e))?);
        }
        Ok(orphans)
    }

    /// Every execution on `shard` that names a parent.
    pub(super) async fn links_on(&self, shard: ShardId) -> Result<Vec<Orphan>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Listing("listing children"),
        };
        let mut all = Vec::new();
        let mut after: (Option<uuid::Uuid>, Option<uuid::Uuid>) = (None, None);
        loop {
            let rows = self
                .query(&call, LINKS, &[&after.0, &after.1, &CHILDREN_PAGE])
                .await?;
            for row in &rows {
                type Link = (uuid::Uuid, uuid::Uuid, String, String, SystemTime);
                let read = || -> Result<Link, tokio_postgres::Error> {
                    Ok((
                        row.try_get("parent_id")?,
                        row.try_get("child_id")?,
                        row.try_get("workflow_name")?,
                        row.try_get("workflow_id")?,
                        row.try_get("created_at")?,
                    ))
                };
                let (parent, child, workflow_name, workflow_id, created_at) =
                    read().map_err(|e| call.error(e, 1))?;
                after = (Some(parent), Some(child));
                all.push(Orphan {
                    execution_id: ExecutionId::from_uuid(child),
                    shard,
                    parent_id: ExecutionId::from_uuid(parent),
                    workflow_name,
                    workflow_id,
                    state: super::executions::read_state(&call, row)?,
                    created_at,
                });
            }
            if rows.len() < CHILDREN_PAGE as usize || all.len() >= MAX_CHILDREN {
                return Ok(all);
            }
        }
    }

    /// Those of `links` (children of parents on `home`) that `home` does not know.
    async fn unknown_on(&self, home: ShardId, links: Vec<Orphan>) -> Result<Vec<Orphan>, ClientError> {
        let call = Call {
            shard: home,
            owned: Owned::Listing("checking children against their parents"),
        };
        let mut orphans = Vec::new();
        for chunk in links.chunks(CHILDREN_PAGE as usize) {
            let ids: Vec<uuid::Uuid> = chunk.iter().map(|o| o.execution_id.as_uuid()).collect();
            let rows = self.query(&call, KNOWN, &[&ids]).await?;
            let known: BTreeSet<uuid::Uuid> = rows
                .iter()
                .map(|r| r.try_get::<_, uuid::Uuid>(0))
                .collect::<Result<_, _>>()
                .map_err(|e| call.error(e, 1))?;
            orphans.extend(
                chunk
                    .iter()
                    .filter(|o| !known.contains(&o.execution_id.as_uuid()))
                    .cloned(),
            );
        }
        Ok(orphans)
    }

    /// Every page of `parent`'s children on `shard`.
    async fn children_on(&self, shard: ShardId, parent: ExecutionId) -> Result<Vec<Child>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Execution(parent),
        };
        let mut all = Vec::new();
        let mut after: Option<uuid::Uuid> = None;
        loop {
            let rows = self
                .query(&call, LIST_CHILDREN, &[&parent.as_uuid(), &after, &CHILDREN_PAGE])
                .await?;
            for row in &rows {
                all.push(child_from_row(&call, row)?);
            }
            after = all.last().map(|c: &Child| c.execution_id.as_uuid());
            if rows.len() < CHILDREN_PAGE as usize || all.len() >= MAX_CHILDREN {
                return Ok(all);
            }
        }
    }
}

impl Admin<'_> {
    /// Children whose parent-side record (`children` where the parent
    /// lives) is gone: the hazard of shards restored to different instants
    /// (docs/concepts/across-shards.md, "Operating it"). Every readable shard's
    /// children are listed and checked where their parents live: first
    /// the shard a parent's id routes to, then, for a parent that moved
    /// (its `children` rows moved with it), where its seal forwards. A
    /// parent found nowhere, or whose shard is not in the topology, makes
    /// its children orphans. For an operator: it reads every child of the
    /// fleet.
    pub async fn orphan_children(self) -> Result<Orphans, ClientError> {
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| self.client.links_on(shard))
            .await;
        refused_argument(&report.failed)?;
        let mut failed = report.failed;
        let mut by_parent_shard: BTreeMap<Option<ShardId>, Vec<Orphan>> = BTreeMap::new();
        for link in report.ok.into_values().flatten() {
            // The lookup starts where the parent's id routes (its origin,
            // or its forward); `unknown_on` follows it from there.
            let home = Some(link.parent_id.route(self.client.topology()))
                .filter(|s| self.client.topology().get(*s).is_some());
            by_parent_shard.entry(home).or_default().push(link);
        }
        let mut items = by_parent_shard.remove(&None).unwrap_or_default();
        for (home, links) in by_parent_shard {
            let Some(home) = home else { continue };
            match self.client.unknown_where_parents_live(home, links).await {
                Ok(orphans) => items.extend(orphans),
                Err((shard, e)) => {
                    failed.insert(shard, e);
                }
            }
        }
        items.sort_by_key(|o| (o.shard, o.execution_id));
        Ok(Orphans {
            items,
            status: status(&failed),
            unavailable_shards: failed,
        })
    }
}

fn child_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<Child, ClientError> {
    let read = || -> Result<(Child, String, i32), tokio_postgres::Error> {
        let state: String = row.try_get("state")?;
        let shard: i32 = row.try_get("shard")?;
        Ok((
            Child {
                execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                shard: call.shard,
                workflow_name: row.try_get("workflow_name")?,
                workflow_id: row.try_get("workflow_id")?,
                state: None,
                created_at: row.try_get("created_at")?,
                closed_at: row.try_get("closed_at")?,
            },
            state,
            shard,
        ))
    };
    let (mut child, state, shard) = read().map_err(|e| call.error(e, 1))?;
    child.shard = ShardId::new(shard as u32).unwrap_or(call.shard);
    if state != "STARTING" {
        child.state = Some(state.parse().map_err(|e| ClientError::Database {
            shard: call.shard,
            code: None,
            message: format!("list_children returned {e}"),
        })?);
    }
    Ok(child)
}
