//! `sheaf tree ID`: every descendant of an execution, across every shard.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sheaf_driver::{Child, ExecutionId, Tree};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// Every descendant of an execution, across every shard, indented under
/// its parent with the shard it runs on. Exits 3 when partial.
#[derive(clap::Args)]
pub struct Args {
    /// The root execution's id.
    execution_id: String,
}

fn child_json(c: &Child) -> Value {
    json!({
        "execution_id": c.execution_id.to_string(),
        "shard": c.shard.get(),
        "workflow_name": c.workflow_name,
        "workflow_id": c.workflow_id,
        "state": c.state.map_or("STARTING", |s| s.as_str()),
    })
}

/// `sheaf tree ID`: every descendant of an execution, indented under its
/// parent, each with its shard.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (id, as_json) = (&args.execution_id, ctx.json);
    let root: ExecutionId = match id.parse() {
        Ok(id) => id,
        Err(e) => return exit::bad_input(format!("{id:?} is not an execution id: {e}")),
    };
    let tree = match client.tree(root).await {
        Ok(t) => t,
        Err(e) => return exit::failed(&e),
    };
    if tree.root_shard.is_none() && tree.nodes.is_empty() && tree.unavailable_shards.is_empty() {
        return exit::fail(Exit::NotFound, format!("no execution {root} where its id routes"));
    }
    if as_json {
        let nodes: Vec<Value> = tree
            .nodes
            .iter()
            .map(|n| {
                let mut v = child_json(&n.child);
                v["parent_id"] = n.parent.to_string().into();
                v["depth"] = n.depth.into();
                v
            })
            .collect();
        print_json(&json!({
            "root": root.to_string(),
            "nodes": nodes,
            "status": tree.status,
            "unavailable_shards": failures_json(&tree.unavailable_shards),
        }));
    } else {
        print_tree(&tree);
    }
    exit::partial_if(&tree.unavailable_shards, !tree.unavailable_shards.is_empty())
}

fn print_tree(tree: &Tree) {
    let mut under: BTreeMap<ExecutionId, Vec<&Child>> = BTreeMap::new();
    for n in &tree.nodes {
        under.entry(n.parent).or_default().push(&n.child);
    }
    let root_shard = tree.root_shard.map_or("?".into(), |s| s.to_string());
    say!("{} (shard {root_shard})", tree.root);
    // Depth first, children in the order the tree has them.
    fn push_children<'a>(
        stack: &mut Vec<(&'a Child, String, bool)>,
        under: &BTreeMap<ExecutionId, Vec<&'a Child>>,
        parent: ExecutionId,
        prefix: &str,
    ) {
        if let Some(kids) = under.get(&parent) {
            for (i, k) in kids.iter().enumerate().rev() {
                stack.push((k, prefix.to_owned(), i + 1 == kids.len()));
            }
        }
    }
    let mut stack: Vec<(&Child, String, bool)> = Vec::new();
    push_children(&mut stack, &under, tree.root, "");
    while let Some((c, prefix, last)) = stack.pop() {
        say!(
            "{prefix}{} {}  {}/{}  shard {}  {}",
            if last { "└─" } else { "├─" },
            c.execution_id,
            c.workflow_name,
            c.workflow_id,
            c.shard,
            c.state.map_or("STARTING", |s| s.as_str())
        );
        let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
        push_children(&mut stack, &under, c.execution_id, &deeper);
    }
    say!("{} descendant(s)", tree.nodes.len());
}
