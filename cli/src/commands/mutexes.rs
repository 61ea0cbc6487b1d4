//! `sheaf mutexes list`: the held mutexes across every shard.

use serde_json::{Value, json};
use sheaf_driver::ListedMutex;

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{Column, cut, print_page, table, time};

/// The durable mutexes held across every shard, a page at a time.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Held mutexes by key (then shard), each with its holder, fencing
    /// token, lease end and waiters; a free key is not listed. Exits 3
    /// when a shard did not answer.
    List {
        /// Mutexes per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
    },
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Action::List { page_size, cursor } = args.what;
    let page = match client.admin().list_mutexes(cursor.as_deref(), page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    print_page(&page, ctx.json, mutex_json, print_table)
}

fn print_table(mutexes: &[ListedMutex]) {
    const COLUMNS: &[Column] = &[
        Column::left("key", 30),
        Column::left("shard", 5),
        Column::left("holder", 36),
        Column::right("token", 10),
        Column::right("waiters", 7),
        Column::left("lease_expires_at", 0),
    ];
    table(
        COLUMNS,
        mutexes.iter().map(|m| {
            vec![
                cut(&m.key, 30),
                m.shard.to_string(),
                m.holder.to_string(),
                m.token.to_string(),
                m.waiters.to_string(),
                time(m.lease_expires_at),
            ]
        }),
    );
}

fn mutex_json(m: &ListedMutex) -> Value {
    json!({
        "key": m.key,
        "shard": m.shard.get(),
        "holder": m.holder.to_string(),
        "token": m.token,
        "acquired_at": time(m.acquired_at),
        "lease_expires_at": time(m.lease_expires_at),
        "waiters": m.waiters,
    })
}
