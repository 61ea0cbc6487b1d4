//! `sheaf shard health`: the pre-flip checklist, one verdict per shard.

use std::process::ExitCode;

use serde_json::{Value, json};

use crate::exit;

/// `sheaf shard health`: each shard's readiness; exit 6 unless all ready.
pub async fn health(
    client: &sheaf_driver::Client,
    candidate: Option<u32>,
    timeout: std::time::Duration,
    as_json: bool,
) -> ExitCode {
    let candidate = match candidate.map(sheaf_driver::ShardId::new).transpose() {
        Ok(Some(id)) if client.topology().get(id).is_none() => {
            return exit::usage(format!(
                "--candidate {id} is not in the topology (add it to SHEAF_SHARDS)"
            ));
        }
        Ok(c) => c,
        Err(e) => return exit::usage(format!("--candidate: {e}")),
    };
    let verdicts = client.shard_health(candidate, timeout).await;
    if as_json {
        let shards: Vec<Value> = verdicts
            .iter()
            .map(|r| {
                json!({
                    "shard": r.shard.get(),
                    "readiness": if r.ready { "ready" } else { "degraded" },
                    "reason_codes": r.reason_codes.iter().map(|c| c.code()).collect::<Vec<_>>(),
                    "details": r.details,
                })
            })
            .collect();
        exit::print_json(&json!({"shards": shards}));
    } else {
        println!("{:<6} {:<9} reasons", "shard", "readiness");
        for r in &verdicts {
            let codes: Vec<&str> = r.reason_codes.iter().map(|c| c.code()).collect();
            println!(
                "{:<6} {:<9} {}",
                r.shard,
                if r.ready { "ready" } else { "degraded" },
                codes.join(", ")
            );
            for d in &r.details {
                println!("         {d}");
            }
        }
    }
    if verdicts.iter().all(|r| r.ready) {
        ExitCode::SUCCESS
    } else {
        exit::NOT_READY.into()
    }
}
