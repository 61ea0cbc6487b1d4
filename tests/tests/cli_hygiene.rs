//! The command line's hygiene (issue 38, item 4): the exit code of every
//! command as the table of docs/operating/cli.md says, each failure as a
//! JSON error under `--json`, and stored text (a task's error, a queue's,
//! workflow's or schedule's name) escaped in every table, so that whoever
//! can fail a task cannot drive the operator's terminal.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_driver::{
    Client, EnqueueOptions, ExecutionId, Placement, PoolOptions, ShardId, StartOptions, TaskId,
};
use sheaf_tests::{cli_binary, fleet, fleet_spec, unique};

/// What an attacker stores: ESC sequences that clear the screen and set
/// the window title, BEL, CR (overwrites the line), LF, DEL, a C1 CSI, the
/// right-to-left override and a zero-width space.
const HOSTILE: &str = "\u{1b}[2J\u{1b}]0;pwned\u{7}\r\u{202e}gnp\n\u{7f}\u{9b}\u{200b}";

/// What a name may hold (a shard refuses control characters in names, not
/// format characters): the right-to-left override, a zero-width space, a
/// left-to-right isolate.
const BIDI: &str = "\u{202e}gnp\u{200b}\u{2066}";

/// [`HOSTILE`] as a table shows it.
const SHOWN: &str = "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\r\\u{202e}gnp\\n\\u{7f}\\u{9b}\\u{200b}";

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client")
}

fn first_shard() -> ShardId {
    fleet().shards().next().expect("a shard").id
}

/// `sheaf ARGS` against the test fleet.
fn sheaf(args: &[&str]) -> Output {
    Command::new(cli_binary())
        .args(args)
        .env("SHEAF_SHARDS", fleet_spec())
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .env_remove("SHEAF_DATABASE_URL")
        .output()
        .expect("the CLI runs")
}

/// Nothing in `text` can drive a terminal: no control character but the
/// line ends, no format (bidi, zero-width) character.
fn assert_inert(what: &str, text: &str) {
    let bad: Vec<String> = text
        .chars()
        .filter(|&c| {
            c != '\n'
                && (c.is_control()
                    || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
        })
        .map(|c| format!("U+{:04X}", u32::from(c)))
        .collect();
    assert!(bad.is_empty(), "{what} prints {bad:?} raw:\n{text}");
}

/// The documented cases of every command: the code it must exit with
/// (docs/operating/cli.md#exit-codes) and its arguments, split at spaces;
/// `NONE` is a name nothing has, `EXECUTION` and `TASK` ids of none.
const CASES: &str = r#"
2 no-such-command
2 list --no-such-flag
0 --help
0 --version
0 status
0 list
2 list --page-size 0
2 list --page-size 1000
2 list --filter not-json
2 list --filter {"no_such_test":1}
2 list --state bogus
2 list --order sideways
2 list --cursor not-a-cursor
4 find NONE NONE
0 usage --from 1h
2 usage --from yesterday
4 executions get EXECUTION
2 executions get not-an-id
4 executions history EXECUTION
4 executions cancel EXECUTION
4 executions pause EXECUTION
4 executions signal EXECUTION go
4 executions cancel --workflow NONE --workflow-id NONE
4 executions signal --workflow NONE --workflow-id NONE go
2 executions cancel --workflow NONE
2 start NONE NONE --input {x
2 start NONE NONE --shard 99
2 enqueue NONE --payload {x
2 enqueue NONE --shard 99
0 tasks list NONE
2 tasks list NONE --state bogus
2 tasks list NONE --page-size 0
4 tasks get TASK
2 tasks get not-an-id
4 tasks cancel TASK
0 dead-letters list --queue NONE
2 dead-letters list --page-size 0
2 dead-letters redrive not-an-id
2 dead-letters purge --queue NONE --older-than soon
0 dead-letters purge --queue NONE --older-than 1h
0 queues
0 rate-limits list
4 rate-limits clear NONE
4 rate-limits clear workflow:NONE
2 rate-limits declare NONE --rate 0
0 schedules list
4 schedules fires NONE
2 schedules fires NONE --limit 0
4 schedules pause NONE
4 schedules resume NONE
4 schedules trigger NONE
4 schedules delete NONE
4 schedules update NONE --spec {}
2 schedules create NONE
2 schedules create NONE --cron not-cron --queue NONE
0 retention get
2 retention set --executions bogus
0 concurrency
0 mutexes list
2 mutexes list --page-size 0
2 mutexes list --cursor not-a-cursor
4 tree EXECUTION
2 tree not-an-id
2 orphans --no-such-flag
2 config show --shard 99
2 config apply /no/such/file.json
0 audit
2 rebalance --from 0 --to 99
2 rebalance-resume --from 99
2 shard drain 99
2 shard health --candidate 99
0 topology digest
2 relay --shard 99
2 ui --listen not-an-address
2 metrics serve --listen not-an-address
"#;

/// [`CASES`], each with its names and ids filled in.
fn cases() -> Vec<(Vec<String>, u8)> {
    let execution = ExecutionId::mint(first_shard()).expect("an id").to_string();
    let task = TaskId::mint(first_shard()).expect("an id").to_string();
    let none = unique("hyg-none");
    CASES
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(code, args)| {
            let args = args
                .replace("NONE", &none)
                .replace("EXECUTION", &execution)
                .replace("TASK", &task);
            let code = code.parse().expect("a code");
            (args.split(' ').map(str::to_owned).collect(), code)
        })
        .collect()
}

/// The name a JSON error gives each code (`Exit::name`).
fn code_name(code: u8) -> &'static str {
    match code {
        1 => "failed",
        2 => "bad_input",
        3 => "partial",
        4 => "not_found",
        _ => "unexpected",
    }
}

#[test]
fn every_command_exits_as_the_table_says() {
    let mut wrong = Vec::new();
    for (args, code) in cases() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let human = sheaf(&args);
        if human.status.code() != Some(i32::from(code)) {
            wrong.push(format!(
                "sheaf {args:?}: exit {:?}, not {code}: {}",
                human.status.code(),
                String::from_utf8_lossy(&human.stderr)
            ));
        }
        let mut with_json = vec!["--json"];
        with_json.extend(&args);
        let out = sheaf(&with_json);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(i32::from(code)) {
            wrong.push(format!(
                "sheaf {with_json:?}: exit {:?}, not {code}: {stderr}",
                out.status.code()
            ));
            continue;
        }
        // Help and version are text, whatever the flags.
        if code == 0
            && !args[0].starts_with("--")
            && let Err(e) = serde_json::from_slice::<Value>(&out.stdout)
        {
            wrong.push(format!("sheaf {with_json:?}: stdout is not JSON ({e})"));
        }
        if code == 0 {
            continue;
        }
        // Each line of stderr is a JSON object; the last is the error.
        let lines: Vec<Value> = stderr
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or(json!({"not json": l})))
            .collect();
        let error = lines.last().map(|l| &l["error"]);
        let expected = (json!(code), json!(code_name(code)));
        match error {
            Some(e) if (e["exit"].clone(), e["code"].clone()) == expected && e["message"].is_string() => {}
            _ => wrong.push(format!(
                "sheaf {with_json:?}: stderr is not a JSON error: {stderr}"
            )),
        }
        if lines.iter().any(|l| l.get("not json").is_some()) {
            wrong.push(format!(
                "sheaf {with_json:?}: a line of stderr is not JSON: {stderr}"
            ));
        }
        // An answer beside the error (`find`'s absent) is JSON too.
        if !out.stdout.is_empty() && serde_json::from_slice::<Value>(&out.stdout).is_err() {
            wrong.push(format!(
                "sheaf {with_json:?}: stdout is not JSON: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A shard that does not answer: `status` fails (1) and a listing is
/// partial (3), each saying so as a JSON error naming the shard, and the
/// connection error says each cause once.
#[test]
fn a_silent_shard_is_said_once_as_json() {
    // Port 1: nothing listens there.
    let spec = format!(
        "{}\n9=postgres://postgres@127.0.0.1:1/sheaf",
        fleet_spec().trim_end()
    );
    let run = |args: &[&str]| {
        Command::new(cli_binary())
            .args(args)
            .env("SHEAF_SHARDS", &spec)
            .env_remove("SHEAF_TOPOLOGY_DIGEST")
            .env_remove("SHEAF_DATABASE_URL")
            .output()
            .expect("the CLI runs")
    };
    let error = |out: &Output| -> Value {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        serde_json::from_str::<Value>(last).unwrap_or_else(|e| panic!("{e}: {stderr}"))["error"].clone()
    };
    let out = run(&["--json", "status"]);
    assert_eq!(out.status.code(), Some(1));
    let e = error(&out);
    assert_eq!(
        (e["code"].as_str(), e["exit"].as_u64()),
        (Some("failed"), Some(1)),
        "{e}"
    );
    assert!(e["message"].as_str().is_some_and(|m| m.contains('9')), "{e}");

    let out = run(&["--json", "list"]);
    assert_eq!(out.status.code(), Some(3));
    let page: Value = serde_json::from_slice(&out.stdout).expect("the partial page");
    assert_eq!(page["status"], "partial", "{page}");
    let e = error(&out);
    assert_eq!(
        (e["code"].as_str(), e["exit"].as_u64()),
        (Some("partial"), Some(3)),
        "{e}"
    );
    let why = e["shards"]["9"].as_str().unwrap_or_default();
    assert!(why.contains("unreachable"), "{e}");
    let cause = "error connecting to server";
    assert_eq!(why.matches(cause).count(), 1, "each cause once: {why}");
}

/// A shard's refusal keeps its SQLSTATE in the JSON error, a bad argument's
/// too (22023 and 22004 are one driver error, which keeps which it was).
#[test]
fn a_refusal_says_its_sqlstate_as_json() {
    let out = sheaf(&["--json", "enqueue", "hygiene-q", "--max-attempts", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    let e = serde_json::from_str::<Value>(last).unwrap_or_else(|e| panic!("{e}: {stderr}"))["error"].clone();
    assert_eq!(e["sqlstate"], "22023", "{e}");
    assert!(e["shard"].is_u64(), "{e}");
}

/// Under --json even a server's first line, its address, is JSON.
#[test]
fn a_server_says_where_it_listens_in_json() {
    use std::io::BufRead;
    for args in [["metrics", "serve"].as_slice(), ["ui"].as_slice()] {
        let mut server = Command::new(cli_binary())
            .arg("--json")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env("SHEAF_SHARDS", fleet_spec())
            .env_remove("SHEAF_TOPOLOGY_DIGEST")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the CLI starts");
        let mut first = String::new();
        let stdout = server.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut first)
            .expect("its first line");
        let _ = server.kill();
        let _ = server.wait();
        let line: Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
        let url = line["serving"].as_str().unwrap_or_default();
        assert!(url.starts_with("http://127.0.0.1:"), "sheaf {args:?}: {first}");
    }
}

/// A clear that finds no override says so (4), and leaves no audit entry.
#[test]
fn clearing_no_override_is_not_found_and_not_audited() {
    let name = unique("hyg-limit");
    let out = sheaf(&["--json", "rate-limits", "declare", &name, "--rate", "5"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sheaf(&["rate-limits", "clear", &name]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing to clear"), "{stderr}");
    let cleared = || {
        let out = sheaf(&["--json", "audit"]);
        let audit: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let items = audit["items"].as_array().cloned().unwrap_or_default();
        items
            .into_iter()
            .filter(|i| i["action"] == "clear_rate_override" && i.to_string().contains(&name))
            .count()
    };
    assert_eq!(cleared(), 0, "a clear of nothing is not sent, so not audited");
    // A live one is cleared on every shard, and said so.
    let out = sheaf(&[
        "rate-limits",
        "override",
        &name,
        "--rate",
        "1",
        "--period",
        "1s",
        "--ttl",
        "10m",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sheaf(&["--json", "rate-limits", "clear", &name]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        answer["changed"].as_array().map(Vec::len),
        Some(fleet().shards().count()),
        "{answer}"
    );
    assert_eq!(cleared(), fleet().shards().count(), "each shard audits its clear");
    let out = sheaf(&["rate-limits", "clear", &name]);
    assert_eq!(out.status.code(), Some(4), "cleared already: nothing to clear");
}

/// The hostile text, stored where the CLI reads it: a queue's, a
/// workflow's and a schedule's name, a workflow id, a payload, and the
/// error of a dead letter and of a task waiting for its retry.
struct Stored {
    queue: String,
    workflow: String,
    schedule: String,
    dead: String,
    retried: String,
}

async fn store_hostile() -> Stored {
    let c = client();
    let shard = first_shard();
    // The hostile text first, so that a column cut short still shows it.
    // sheaf refuses such names now (docs/reference/input-rules.md); a
    // queue and a run stored before that rule keep working, so they are
    // written here as an older sheaf would have left them.
    let queue = format!("{BIDI}{}", unique("q"));
    let workflow = format!("{BIDI}{}", unique("wf"));
    let db = sheaf_tests::connect(fleet().get(shard).expect("the first shard")).await;
    db.execute("INSERT INTO sheaf.queues (name) VALUES ($1)", &[&queue])
        .await
        .expect("a queue stored before the name rule");
    db.execute(
        "INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input, closed_at) \
         VALUES (sheaf.new_id(), $1, $2, 'COMPLETED', nextval('sheaf.execution_seq'), $3, '{}', now())",
        &[&workflow, &HOSTILE, &queue],
    )
    .await
    .expect("a run stored before the name rule");
    let on = || EnqueueOptions::new().placement(Placement::Shard(shard));
    let dead = c
        .enqueue(&queue, json!({"note": HOSTILE}), on().max_attempts(1))
        .await
        .expect("enqueue");
    let retried = c
        .enqueue(&queue, json!({}), on().max_attempts(5))
        .await
        .expect("enqueue");
    let claimed = c
        .claim(shard, &queue, "hyg", 2, Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    for t in &claimed {
        let error = format!("boom{HOSTILE}");
        c.fail(t.task_id, t.token, &error, Some(Duration::from_secs(3600)))
            .await
            .expect("fail");
    }
    let pinned = StartOptions::new().placement(Placement::Shard(shard));
    c.start_workflow(&workflow, HOSTILE, json!({}), pinned)
        .await
        .expect("start");
    let schedule = unique("s");
    let out = sheaf(&[
        "schedules",
        "create",
        &schedule,
        "--cron",
        "@yearly",
        "--queue",
        &queue,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Stored {
        queue,
        workflow,
        schedule,
        dead: dead.task_id.to_string(),
        retried: retried.task_id.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_control_characters_are_escaped_in_tables() {
    let s = store_hostile().await;
    let reads: Vec<Vec<&str>> = vec![
        vec!["dead-letters", "list", "--queue", &s.queue],
        vec!["tasks", "list", &s.queue],
        vec!["tasks", "get", &s.dead],
        vec!["tasks", "get", &s.retried],
        vec!["queues"],
        vec!["list", "--workflow", &s.workflow],
        vec!["find", &s.workflow, HOSTILE],
    ];
    for args in &reads {
        let out = sheaf(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "sheaf {args:?}: {stderr}");
        let stdout = String::from_utf8(out.stdout).expect("UTF-8");
        assert_inert(&format!("sheaf {args:?}"), &stdout);
        assert_inert(&format!("sheaf {args:?} (stderr)"), &stderr);
        assert!(
            stdout.contains("\\u{202e}gnp\\u{200b}") || stdout.contains("\\u{1b}[2J"),
            "sheaf {args:?} shows the text escaped:\n{stdout}"
        );
    }
    // The error itself, whole, where a table has room for it.
    let out = sheaf(&["tasks", "get", &s.dead]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("boom{SHOWN}")), "{stdout}");

    // JSON is exact: the same text, read back, and nothing raw on the way.
    for args in &reads {
        let mut with_json = vec!["--json"];
        with_json.extend(args);
        let out = sheaf(&with_json);
        let stdout = String::from_utf8(out.stdout).expect("UTF-8");
        assert_inert(&format!("sheaf {with_json:?}"), &stdout);
        serde_json::from_str::<Value>(&stdout).expect("JSON");
    }
    let out = sheaf(&["--json", "dead-letters", "list", "--queue", &s.queue]);
    let page: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let item = &page["items"][0];
    assert_eq!(item["last_error"], json!(format!("boom{HOSTILE}")), "{page}");
    assert_eq!(item["queue"], json!(s.queue), "{page}");

    // A name in an error message is escaped too, under --json as well.
    // (Looked up, not stored: a lookup takes any name.)
    let missing = format!("{BIDI}{}-gone", s.schedule);
    for json in [false, true] {
        let args = [
            &["--json"][..usize::from(json)],
            &["schedules", "fires", &missing],
        ]
        .concat();
        let out = sheaf(&args);
        assert_eq!(out.status.code(), Some(4));
        assert_inert(
            &format!("sheaf {args:?} (stderr)"),
            &String::from_utf8_lossy(&out.stderr),
        );
    }
    let out = sheaf(&["schedules", "delete", &s.schedule]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
