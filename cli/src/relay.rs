//! `sheaf relay`, `sheaf tree` and `sheaf orphans`: the cross-shard half.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_driver::{Child, Client, ClientError, ExecutionId, Relay, RelayOptions, ShardId, Tree};

use crate::exit;

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
pub async fn tree(client: &Client, id: &str, as_json: bool) -> ExitCode {
    let root: ExecutionId = match id.parse() {
        Ok(id) => id,
        Err(e) => return exit::usage(format!("{id:?} is not an execution id: {e}")),
    };
    let tree = match client.tree(root).await {
        Ok(t) => t,
        Err(e) => return exit::failed(&e),
    };
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
        exit::print_json(&json!({
            "root": root.to_string(),
            "nodes": nodes,
            "status": tree.status,
            "unavailable_shards": exit::failures_json(&tree.unavailable_shards),
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
    println!("{} (shard {root_shard})", tree.root);
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
        println!(
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
    println!("{} descendant(s)", tree.nodes.len());
}

/// `sheaf orphans`: children whose parent's shard has no record of them.
pub async fn orphans(client: &Client, as_json: bool) -> ExitCode {
    let found = match client.orphan_children().await {
        Ok(o) => o,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        let items: Vec<Value> = found
            .items
            .iter()
            .map(|o| {
                json!({
                    "execution_id": o.execution_id.to_string(),
                    "shard": o.shard.get(),
                    "parent_id": o.parent_id.to_string(),
                    "workflow_name": o.workflow_name,
                    "workflow_id": o.workflow_id,
                    "state": o.state.as_str(),
                })
            })
            .collect();
        exit::print_json(&json!({
            "items": items,
            "status": found.status,
            "unavailable_shards": exit::failures_json(&found.unavailable_shards),
        }));
    } else if found.items.is_empty() {
        println!("no orphaned children");
    } else {
        println!(
            "{:<38} {:<6} {:<38} {:<10} workflow",
            "child", "shard", "parent", "state"
        );
        for o in &found.items {
            println!(
                "{:<38} {:<6} {:<38} {:<10} {}/{}",
                o.execution_id.to_string(),
                o.shard,
                o.parent_id.to_string(),
                o.state.as_str(),
                o.workflow_name,
                o.workflow_id
            );
        }
    }
    if !found.unavailable_shards.is_empty() {
        return exit::partial_if(&found.unavailable_shards, true);
    }
    if found.items.is_empty() {
        ExitCode::SUCCESS
    } else {
        exit::FOUND.into()
    }
}

/// `sheaf relay`: the relay alone, for `shards` (all when empty), until
/// SIGINT or SIGTERM; every `report_every` a line per shard with its backlog.
/// Exits 7 at once when the login lacks `sheaf_relay` on one of them; a
/// shard that does not answer yet is relayed once it does.
pub async fn run(client: Client, shards: Vec<u32>, report_every: Duration, as_json: bool) -> ExitCode {
    let all: Vec<ShardId> = client.topology().shards().map(|s| s.id).collect();
    let mut chosen = Vec::new();
    for n in shards {
        match all.iter().find(|s| s.get() as u32 == n) {
            Some(s) => chosen.push(*s),
            None => return exit::usage(format!("--shard {n} is not in the topology")),
        }
    }
    if chosen.is_empty() {
        chosen = all;
    }
    for &shard in &chosen {
        match client.check_protocol_role(shard).await {
            Ok(()) => {}
            Err(e @ ClientError::MissingRole { .. }) => {
                eprintln!("sheaf: the relay needs role sheaf_relay: {e}");
                return exit::NO_ROLE.into();
            }
            Err(e) => eprintln!("sheaf: shard {shard} did not answer ({e}); relayed once it does"),
        }
    }
    let client = Arc::new(client);
    let relay = Relay::start(client.clone(), chosen.clone(), RelayOptions::default());
    if !as_json {
        let names: Vec<String> = chosen.iter().map(ToString::to_string).collect();
        println!("relay running for shard(s) {}; Ctrl-C stops it", names.join(", "));
    }
    let stop = stopped();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(report_every);
    tick.tick().await;
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => report(&client, &chosen, as_json).await,
        }
    }
    relay.shutdown().await;
    if !as_json {
        println!("relay stopped");
    }
    ExitCode::SUCCESS
}

async fn report(client: &Client, shards: &[ShardId], as_json: bool) {
    for &shard in shards {
        let children = client.relay_backlog(shard).await;
        let outbox = client.outbox_backlog(shard).await;
        match (children, outbox) {
            (Ok(c), Ok(o)) => {
                let (rows, failing): (i64, i64) =
                    c.iter().fold((0, 0), |a, b| (a.0 + b.rows, a.1 + b.failing));
                let (pending, stuck): (i64, i64) = o
                    .iter()
                    .fold((0, 0), |a, b| (a.0 + b.rows, a.1 + b.indeterminate));
                if as_json {
                    println!(
                        "{}",
                        json!({"shard": shard.get(), "children": rows, "children_failing": failing,
                               "outbox": pending, "outbox_indeterminate": stuck})
                    );
                } else {
                    println!(
                        "shard {shard}: {rows} child row(s) ({failing} failing), {pending} outbox row(s) ({stuck} indeterminate)"
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => eprintln!("sheaf: shard {shard}: {e}"),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn stopped() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
