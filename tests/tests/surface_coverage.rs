//! Every function of schema `sheaf` has a typed `Client` method: its call
//! `sheaf.<name>(` appears in the driver's source (driver/src), unless it is
//! on the allow-list below with the reason it has none. A new SQL function
//! without a method fails this test (CONTRIBUTING.md, "Adding a SQL function").

use std::path::Path;

use sheaf_tests::{connect, fleet, repo_root};

/// Functions that intentionally have no `Client` method, and why.
const NO_METHOD: &[(&str, &str)] = &[
    // The ready index's key expression (sql/schema.sql), not an API.
    ("ready_k1", "an index expression"),
    (
        "ready_aging_band",
        "a ready row's column, computed beside ready_k1",
    ),
    // Id decoding and minting are local, with no round trip, and pinned to
    // the extension by core/testdata/id_vectors.json: ExecutionId::mint /
    // TaskId::mint, ::shard() and ::timestamp().
    ("new_id", "ExecutionId::mint / TaskId::mint"),
    ("id_shard", "ExecutionId::shard / TaskId::shard"),
    ("id_timestamp", "ExecutionId::timestamp / TaskId::timestamp"),
    // Placement is answered locally by the router, with no round trip,
    // over the same sheaf_core::placement code; core/testdata/
    // placement_vectors.json and tests/tests/placement.rs keep the two in
    // agreement. The functions serve clients in other languages.
    ("place_start", "Topology::place (router)"),
    ("place_task", "the router's task placement (Client::enqueue)"),
    ("place_mutex", "Client::mutex_shard"),
    ("locate_id", "ExecutionId::route / TaskId::route"),
    // The driver holds its topology itself (Admin::published_topology
    // compares digests); the projections serve other languages' routers.
    ("topology_projections", "Topology (the driver's own)"),
];

/// Every `.rs` file under `dir`, as its code: comment lines are left out,
/// so a function named in a doc comment does not count as called.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let text =
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            out.push((path.display().to_string(), code.join("\n")));
        }
    }
}

#[tokio::test]
async fn every_sql_function_has_a_client_method() {
    let shard = fleet().shards().next().expect("the test fleet has a shard");
    let db = connect(shard).await;
    let rows = db
        .query(
            "SELECT DISTINCT p.proname::text FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'sheaf' ORDER BY 1",
            &[],
        )
        .await
        .expect("listing the functions of schema sheaf");
    let functions: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        functions.len() > 40,
        "only {} functions: wrong database?",
        functions.len()
    );
    let mut files = Vec::new();
    sources(&repo_root().join("driver/src"), &mut files);
    let mut problems = Vec::new();
    for name in &functions {
        let call = format!("sheaf.{name}(");
        let called = files.iter().any(|(_, text)| text.contains(&call));
        let allowed = NO_METHOD.iter().any(|(n, _)| n == name);
        match (called, allowed) {
            (false, false) => problems.push(format!(
                "sheaf.{name}: no Client method calls it in driver/src (add one, or say why not in NO_METHOD)"
            )),
            (true, true) => problems.push(format!("sheaf.{name}: has a method now; take it off NO_METHOD")),
            _ => {}
        }
    }
    for (name, _) in NO_METHOD {
        if !functions.iter().any(|f| f == name) {
            problems.push(format!(
                "NO_METHOD lists sheaf.{name}, which is not a function of schema sheaf"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the typed surface is incomplete:\n  {}",
        problems.join("\n  ")
    );
}
