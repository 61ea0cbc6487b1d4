//! The SQL reference cannot drift from the catalog. Every function row of
//! `docs/reference/sql/*.md` (a table row whose first cell is
//! `` `sheaf.name(arg type [DEFAULT value], ...)` ``, several joined by ` / `;
//! its second cell the return type, or `same` for the row above's; its third
//! the role) is compared with the live shard's `pg_proc`, both ways:
//!
//! - a documented signature (name and argument types in order, the types
//!   spelled as PostgreSQL spells them: `to_regtype`) exists in schema
//!   `sheaf`, with the documented argument names, the same arguments
//!   defaulted and to the same values (both evaluated by PostgreSQL), the
//!   documented return type (`TABLE(...)` columns by name and type; `a, b
//!   bigint` types both), and callable by the documented role and not by the
//!   role below it (worker < relay < admin);
//! - every function of schema `sheaf` is documented by exactly one row, but
//!   the few on [`UNDOCUMENTED`].
//!
//! A failure lists every difference as `file:line`. A second test breaks a
//! copy of the reference on purpose and sees each break reported.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use sheaf_tests::{connect, fleet, repo_root};
use tokio_postgres::Client;

/// Functions of schema `sheaf` that are deliberately not in the reference.
const UNDOCUMENTED: &[(&str, &str)] = &[
    // The ready set's keys (sql/schema.sql): the extension's own functions
    // compute a ready row's k1 and aging_band columns with them. No sheaf
    // role may execute them (only the owner), so they are no API; the SQL
    // API's README names them only to say they pin no search_path.
    ("ready_k1", "computes a ready row's k1 (sql/schema.sql)"),
    (
        "ready_aging_band",
        "computes a ready row's aging_band (sql/schema.sql)",
    ),
];

/// The roles of the third column, each with the role just below it, which
/// must not be able to call what the documented role is needed for.
const ROLES: &[(&str, &str, Option<&str>)] = &[
    ("worker", "sheaf_worker", None),
    ("relay", "sheaf_relay", Some("sheaf_worker")),
    ("admin", "sheaf_admin", Some("sheaf_relay")),
];

/// One argument as documented: its name, its type as written and the
/// default's SQL, if any.
#[derive(Clone, Debug)]
struct Arg {
    name: String,
    ty: String,
    default: Option<String>,
}

/// A return type as documented (types as written).
#[derive(Clone, Debug)]
enum Returns {
    /// `type` or `SETOF type`.
    Scalar { setof: bool, ty: String },
    /// `TABLE(name type, ...)`, the types of grouped names filled in.
    Table(Vec<(String, String)>),
}

/// One documented signature, where it is written.
#[derive(Clone, Debug)]
struct Documented {
    at: String,
    name: String,
    args: Vec<Arg>,
    returns: Returns,
    role: String,
}

/// One function of schema `sheaf` as the catalog has it.
#[derive(Debug)]
struct Catalogued {
    oid: u32,
    name: String,
    identity: String,
    arg_names: Vec<String>,
    arg_types: Vec<String>,
    /// `TABLE(...)` in the spelling [`Returns::canonical`] makes, or
    /// `pg_get_function_result` for anything else.
    result: String,
    defaults: usize,
    default_exprs: String,
}

impl Catalogued {
    fn signature(&self) -> String {
        format!("sheaf.{}({})", self.name, self.identity)
    }
}

impl Returns {
    /// The type names it writes, to be normalised.
    fn types(&self) -> Vec<&str> {
        match self {
            Returns::Scalar { ty, .. } => vec![ty.as_str()],
            Returns::Table(cols) => cols.iter().map(|(_, t)| t.as_str()).collect(),
        }
    }

    /// As `pg_get_function_result` spells it, with each type normalised.
    fn canonical(&self, types: &HashMap<String, String>) -> String {
        let norm = |t: &String| types.get(t).cloned().unwrap_or_else(|| t.clone());
        match self {
            Returns::Scalar { setof: true, ty } => format!("SETOF {}", norm(ty)),
            Returns::Scalar { setof: false, ty } => norm(ty),
            Returns::Table(cols) => table(cols.iter().map(|(n, t)| (n.clone(), norm(t)))),
        }
    }
}

fn table(cols: impl Iterator<Item = (String, String)>) -> String {
    let cols: Vec<String> = cols.map(|(n, t)| format!("{n} {t}")).collect();
    format!("TABLE({})", cols.join(", "))
}

/// The cells of a Markdown table row; a `|` inside a code span or escaped
/// does not split.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut code = false;
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => cell.push(chars.next().unwrap()),
            '`' => {
                code = !code;
                cell.push(c);
            }
            '|' if !code => out.push(std::mem::take(&mut cell).trim().to_string()),
            _ => cell.push(c),
        }
    }
    out.push(cell.trim().to_string());
    out
}

/// The code spans of a cell and whether anything but ` / ` separates them.
fn spans(cell: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = cell.split('`').collect();
    if parts.len() < 3 || parts.len().is_multiple_of(2) {
        return Err(format!("not one or more code spans: {cell}"));
    }
    let (first, last) = (parts[0].trim(), parts[parts.len() - 1].trim());
    let between_ok = parts[2..parts.len() - 1]
        .iter()
        .step_by(2)
        .all(|s| s.trim() == "/");
    if !first.is_empty() || !last.is_empty() || !between_ok {
        return Err(format!(
            "code spans must be joined by ` / ` and nothing else: {cell}"
        ));
    }
    Ok(parts.iter().skip(1).step_by(2).copied().collect())
}

/// Splits on commas outside quotes, parentheses and brackets.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut depth, mut quoted) = (0i32, false);
    for c in s.chars() {
        match c {
            '\'' => quoted = !quoted,
            '(' | '[' if !quoted => depth += 1,
            ')' | ']' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() || !out.is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// `sheaf.name(arg type [DEFAULT value], ...)`.
fn parse_call(call: &str) -> Result<(String, Vec<Arg>), String> {
    let rest = call
        .strip_prefix("sheaf.")
        .ok_or_else(|| format!("`{call}` does not start with sheaf."))?;
    let open = rest
        .find('(')
        .ok_or_else(|| format!("`{call}` has no argument list"))?;
    let name = &rest[..open];
    let inner = rest[open + 1..]
        .strip_suffix(')')
        .ok_or_else(|| format!("`{call}` does not end with its argument list"))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!("`{call}`: `{name}` is not a function name"));
    }
    let mut args = Vec::new();
    for arg in split_top(inner) {
        let (name, rest) = arg
            .split_once(' ')
            .ok_or_else(|| format!("`{call}`: argument `{arg}` has no name or no type"))?;
        let (ty, default) = match rest.to_ascii_uppercase().find(" DEFAULT ") {
            Some(i) => (&rest[..i], Some(rest[i + " DEFAULT ".len()..].trim().to_string())),
            None => (rest, None),
        };
        args.push(Arg {
            name: name.to_string(),
            ty: ty.trim().to_string(),
            default,
        });
    }
    Ok((name.to_string(), args))
}

/// `type`, `SETOF type` or `TABLE(a type, b, c type, ...)`, where a type
/// after several names is the type of each (`b` is `c`'s type above).
fn parse_returns(span: &str) -> Result<Returns, String> {
    if let Some(ty) = span.strip_prefix("SETOF ") {
        return Ok(Returns::Scalar {
            setof: true,
            ty: ty.trim().to_string(),
        });
    }
    let Some(inner) = span.strip_prefix("TABLE(").and_then(|s| s.strip_suffix(')')) else {
        return Ok(Returns::Scalar {
            setof: false,
            ty: span.trim().to_string(),
        });
    };
    let mut cols: Vec<(String, String)> = Vec::new();
    let mut untyped = Vec::new();
    for col in split_top(inner) {
        match col.split_once(' ') {
            Some((name, ty)) => {
                for n in untyped.drain(..) {
                    cols.push((n, ty.trim().to_string()));
                }
                cols.push((name.to_string(), ty.trim().to_string()));
            }
            None => untyped.push(col),
        }
    }
    if !untyped.is_empty() {
        return Err(format!(
            "`{span}`: no type for {} (write it after the last of them)",
            untyped.join(", ")
        ));
    }
    Ok(Returns::Table(cols))
}

/// Every documented signature of `files` (shown name, text), and every row
/// that names a function but does not parse.
fn documented(files: &[(String, String)]) -> (Vec<Documented>, Vec<String>) {
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (file, text) in files {
        let mut previous: Option<Returns> = None;
        for (i, line) in text.lines().enumerate() {
            let at = format!("{file}:{}", i + 1);
            if !line.trim_start().starts_with('|') {
                previous = None;
                continue;
            }
            let cells = cells(line);
            if !cells[0].contains("`sheaf.") {
                continue;
            }
            let parsed = (|| {
                if cells.len() < 3 {
                    return Err("fewer than three cells (signature, returns, role)".to_string());
                }
                let calls = spans(&cells[0])?
                    .into_iter()
                    .map(parse_call)
                    .collect::<Result<Vec<_>, _>>()?;
                let returns = if cells[1] == "same" {
                    previous.clone().ok_or("returns `same` with no row above")?
                } else {
                    match spans(&cells[1])?.as_slice() {
                        [one] => parse_returns(one)?,
                        _ => return Err(format!("returns: one code span, not {}", cells[1])),
                    }
                };
                Ok((calls, returns, cells[2].clone()))
            })();
            match parsed {
                Ok((calls, returns, role)) => {
                    previous = Some(returns.clone());
                    for (name, args) in calls {
                        rows.push(Documented {
                            at: at.clone(),
                            name,
                            args,
                            returns: returns.clone(),
                            role: role.clone(),
                        });
                    }
                }
                Err(e) => {
                    previous = None;
                    problems.push(format!("{at}: a row of the reference that does not parse: {e}"));
                }
            }
        }
    }
    (rows, problems)
}

/// Every function of schema `sheaf`.
async fn catalog(db: &Client) -> Vec<Catalogued> {
    let rows = db
        .query(
            "SELECT p.oid, p.proname::text, \
                    pg_catalog.pg_get_function_identity_arguments(p.oid), \
                    pg_catalog.pg_get_function_result(p.oid), \
                    a.arg_names, a.arg_types, a.column_names, a.column_types, \
                    p.pronargdefaults::int, coalesce(pg_catalog.pg_get_expr(p.proargdefaults, 0), '') \
             FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace, \
             LATERAL (SELECT \
                 coalesce(array_agg(coalesce(x.name, '') ORDER BY x.n) FILTER (WHERE x.mode IN ('i', 'b', 'v')), '{}') AS arg_names, \
                 coalesce(array_agg(pg_catalog.format_type(x.type, NULL) ORDER BY x.n) FILTER (WHERE x.mode IN ('i', 'b', 'v')), '{}') AS arg_types, \
                 coalesce(array_agg(coalesce(x.name, '') ORDER BY x.n) FILTER (WHERE x.mode = 't'), '{}') AS column_names, \
                 coalesce(array_agg(pg_catalog.format_type(x.type, NULL) ORDER BY x.n) FILTER (WHERE x.mode = 't'), '{}') AS column_types \
               FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), \
                           coalesce(p.proargmodes::text[], array_fill('i'::text, ARRAY[p.pronargs::int])), \
                           p.proargnames) WITH ORDINALITY AS x(type, mode, name, n)) a \
             WHERE n.nspname = 'sheaf' \
             ORDER BY 2, 3",
            &[],
        )
        .await
        .expect("listing the functions of schema sheaf");
    rows.iter()
        .map(|r| {
            let column_names: Vec<String> = r.get(6);
            let column_types: Vec<String> = r.get(7);
            let result = if column_names.is_empty() {
                r.get(3)
            } else {
                table(column_names.into_iter().zip(column_types))
            };
            Catalogued {
                oid: r.get(0),
                name: r.get(1),
                identity: r.get(2),
                arg_names: r.get(4),
                arg_types: r.get(5),
                result,
                defaults: usize::try_from(r.get::<_, i32>(8)).expect("pronargdefaults >= 0"),
                default_exprs: r.get(9),
            }
        })
        .collect()
}

/// Each documented type spelling as PostgreSQL spells it; a spelling that
/// is no type is reported and left out.
async fn normalise(db: &Client, rows: &[Documented], problems: &mut Vec<String>) -> HashMap<String, String> {
    let mut spellings: BTreeMap<&str, String> = BTreeMap::new();
    for row in rows {
        for t in row.args.iter().map(|a| a.ty.as_str()).chain(row.returns.types()) {
            spellings
                .entry(t)
                .or_insert_with(|| format!("{}: sheaf.{}", row.at, row.name));
        }
    }
    let mut types = HashMap::new();
    for (spelling, at) in spellings {
        // One query each: before PostgreSQL 16 a syntax error in the name
        // raises instead of returning NULL.
        match db.query_one("SELECT to_regtype($1)::text", &[&spelling]).await {
            Ok(row) => match row.get::<_, Option<String>>(0) {
                Some(t) => {
                    types.insert(spelling.to_string(), t);
                }
                None => problems.push(format!("{at}: `{spelling}` is not a type")),
            },
            Err(e) => problems.push(format!("{at}: `{spelling}` is not a type: {e}")),
        }
    }
    types
}

/// The documented defaults and the catalog's, evaluated by PostgreSQL (the
/// documented ones cast to the argument's type), in a read-only transaction.
async fn defaults_differ(db: &mut Client, row: &Documented, f: &Catalogued) -> Option<String> {
    let first = f.arg_types.len() - f.defaults;
    let documented: Vec<String> = row.args[first..]
        .iter()
        .zip(&f.arg_types[first..])
        .map(|(a, ty)| format!("({})::{ty}", a.default.as_deref().unwrap_or("NULL")))
        .collect();
    let sql = format!(
        "SELECT to_jsonb(ROW({})), to_jsonb(ROW({}))",
        documented.join(", "),
        f.default_exprs
    );
    let tx = db
        .build_transaction()
        .read_only(true)
        .start()
        .await
        .expect("a read-only transaction");
    let values = tx.query_one(sql.as_str(), &[]).await;
    tx.rollback().await.ok();
    let row_values = match values {
        Ok(r) => r,
        Err(e) => return Some(format!("its defaults do not evaluate ({sql}): {e}")),
    };
    let (doc, cat): (serde_json::Value, serde_json::Value) = (row_values.get(0), row_values.get(1));
    let differ: Vec<String> = row.args[first..]
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let key = format!("f{}", i + 1);
            (doc[&key] != cat[&key]).then(|| {
                format!(
                    "{} DEFAULT {} is {} but the catalog's default is {}",
                    a.name,
                    a.default.as_deref().unwrap_or("NULL"),
                    doc[&key],
                    cat[&key]
                )
            })
        })
        .collect();
    (!differ.is_empty()).then(|| format!("{} (the catalog: {})", differ.join("; "), f.default_exprs))
}

/// Whether `role` may execute function `oid` (members included).
async fn may_call(db: &Client, role: &str, oid: u32) -> bool {
    db.query_one(
        "SELECT has_function_privilege($1, $2::oid, 'EXECUTE')",
        &[&role, &oid],
    )
    .await
    .unwrap_or_else(|e| panic!("has_function_privilege({role}, {oid}): {e}"))
    .get(0)
}

/// Every difference between the reference in `files` and the live catalog.
async fn differences(db: &mut Client, files: &[(String, String)]) -> Vec<String> {
    let (rows, mut problems) = documented(files);
    let types = normalise(db, &rows, &mut problems).await;
    let functions = catalog(db).await;
    let mut by_key: HashMap<(String, Vec<String>), &Catalogued> = HashMap::new();
    for f in &functions {
        by_key.insert((f.name.clone(), f.arg_types.clone()), f);
    }
    let mut documented_at: HashMap<u32, String> = HashMap::new();
    for row in &rows {
        let norm = |t: &String| types.get(t).cloned().unwrap_or_else(|| t.clone());
        let arg_types: Vec<String> = row.args.iter().map(|a| norm(&a.ty)).collect();
        let shown = format!("{}: sheaf.{}({})", row.at, row.name, arg_types.join(", "));
        let Some(f) = by_key.get(&(row.name.clone(), arg_types)) else {
            let same_name: Vec<String> = functions
                .iter()
                .filter(|f| f.name == row.name)
                .map(Catalogued::signature)
                .collect();
            problems.push(if same_name.is_empty() {
                format!("{shown}: no function of that name in schema sheaf")
            } else {
                format!(
                    "{shown}: no such signature; the catalog has {}",
                    same_name.join(", ")
                )
            });
            continue;
        };
        if let Some(first) = documented_at.insert(f.oid, row.at.clone()) {
            problems.push(format!("{shown}: documented twice (also at {first})"));
        }
        let found = row_differences(db, row, f, &types).await;
        problems.extend(found.into_iter().map(|p| format!("{shown}: {p}")));
    }
    problems.extend(undocumented(&functions, &documented_at));
    problems
}

/// How a documented row differs from the function it names: the
/// arguments' names and defaults, the return type, the role.
async fn row_differences(
    db: &mut Client,
    row: &Documented,
    f: &Catalogued,
    types: &HashMap<String, String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let names: Vec<&str> = row.args.iter().map(|a| a.name.as_str()).collect();
    if names != f.arg_names {
        problems.push(format!(
            "arguments named ({}) but the catalog names them ({})",
            names.join(", "),
            f.arg_names.join(", ")
        ));
    }
    let first_default = f.arg_types.len() - f.defaults;
    let mut defaults_match = true;
    for (i, a) in row.args.iter().enumerate() {
        match (&a.default, i >= first_default) {
            (Some(d), false) => problems.push(format!(
                "{} documented with DEFAULT {d} but the catalog has no default for it",
                a.name
            )),
            (None, true) => problems.push(format!(
                "{} documented without a default but the catalog has one ({})",
                a.name, f.default_exprs
            )),
            _ => continue,
        }
        defaults_match = false;
    }
    if defaults_match
        && f.defaults > 0
        && let Some(why) = defaults_differ(db, row, f).await
    {
        problems.push(why);
    }
    let returns = row.returns.canonical(types);
    if returns != f.result {
        problems.push(format!("returns {returns} but the catalog says {}", f.result));
    }
    match ROLES.iter().find(|(word, _, _)| *word == row.role) {
        None => problems.push(format!("role `{}` is none of worker, relay, admin", row.role)),
        Some((_, role, below)) => {
            if !may_call(db, role, f.oid).await {
                problems.push(format!("documented for {} but {role} may not call it", row.role));
            }
            if let Some(below) = below
                && may_call(db, below, f.oid).await
            {
                problems.push(format!("documented for {} but {below} may call it too", row.role));
            }
        }
    }
    problems
}

/// The catalog's functions no row documents (but [`UNDOCUMENTED`]'s), and
/// [`UNDOCUMENTED`]'s entries that are documented or gone.
fn undocumented(functions: &[Catalogued], documented_at: &HashMap<u32, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let listed: BTreeSet<&str> = UNDOCUMENTED.iter().map(|(n, _)| *n).collect();
    for f in functions {
        match (documented_at.get(&f.oid), listed.contains(f.name.as_str())) {
            (None, false) => problems.push(format!(
                "{}: in schema sheaf but documented nowhere in docs/reference/sql/ \
                 (add its row, or say on UNDOCUMENTED why not)",
                f.signature()
            )),
            (Some(at), true) => problems.push(format!(
                "{}: documented at {at} yet on UNDOCUMENTED; take it off",
                f.signature()
            )),
            _ => {}
        }
    }
    for name in listed {
        if !functions.iter().any(|f| f.name == name) {
            problems.push(format!(
                "UNDOCUMENTED lists sheaf.{name}, which is not a function of schema sheaf"
            ));
        }
    }
    problems
}

/// The reference's pages: (path from the repository's root, text).
fn reference() -> Vec<(String, String)> {
    let root = repo_root();
    let dir = root.join("docs/reference/sql");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            (shown(&root, p), text)
        })
        .collect()
}

fn shown(root: &Path, path: &Path) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&root).unwrap_or(&path).display().to_string()
}

async fn shard_client() -> Client {
    connect(fleet().shards().next().expect("the test fleet has a shard")).await
}

#[tokio::test]
async fn the_sql_reference_matches_the_catalog() {
    let files = reference();
    assert!(
        files.len() >= 5,
        "the SQL reference's pages: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let (rows, _) = documented(&files);
    assert!(
        rows.len() > 100,
        "only {} documented signatures: is the parser reading the tables?",
        rows.len()
    );
    let mut db = shard_client().await;
    let problems = differences(&mut db, &files).await;
    assert!(
        problems.is_empty(),
        "{} difference(s) between docs/reference/sql/ and schema sheaf:\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Changes to a copy of the reference, each a drift the check must report:
/// (what the page has, what it is changed to).
const BREAKS: &[(&str, &str)] = &[
    // A signature: an argument's type.
    (
        "`sheaf.enqueue(queue text, payload jsonb,",
        "`sheaf.enqueue(queue text, payload json,",
    ),
    // A return type.
    (
        "| `sheaf.find_task(queue text, idempotency_key text)` | `uuid` |",
        "| `sheaf.find_task(queue text, idempotency_key text)` | `text` |",
    ),
    // A TABLE column's type.
    (
        "queue_position int)` | worker",
        "queue_position bigint)` | worker",
    ),
    // A default's value, and a default left out.
    (
        "`sheaf.reap_expired(max_rows int DEFAULT 1000)`",
        "`sheaf.reap_expired(max_rows int DEFAULT 100)`",
    ),
    (
        "`sheaf.complete(task_id uuid, token bigint, result jsonb DEFAULT NULL)`",
        "`sheaf.complete(task_id uuid, token bigint, result jsonb)`",
    ),
    // An argument's name.
    (
        "`sheaf.snooze(task_id uuid, token bigint, delay interval)`",
        "`sheaf.snooze(task_id uuid, token bigint, wait interval)`",
    ),
    // A role too low (relay_pulled is the relay's) and one too high.
    (
        "`sheaf.relay_pulled(child_id uuid)` | `boolean` | relay",
        "`sheaf.relay_pulled(child_id uuid)` | `boolean` | worker",
    ),
    (
        "`sheaf.version()` | `text` | worker",
        "`sheaf.version()` | `text` | admin",
    ),
    // No such type.
    (
        "`sheaf.mutex_leave(key text, owner uuid)`",
        "`sheaf.mutex_leave(key txet, owner uuid)`",
    ),
    // A row that does not parse (its closing parenthesis left out).
    (
        "`sheaf.mutex_reclaim(max_rows int DEFAULT 1000)`",
        "`sheaf.mutex_reclaim(max_rows int DEFAULT 1000`",
    ),
];

/// What the check must say about [`BREAKS`], a deleted row (mutex_status)
/// and a row written twice (new_id): (the function, a part of the message).
const EXPECTED: &[(&str, &str)] = &[
    (
        "enqueue",
        "sheaf.enqueue(text, json, jsonb): no such signature; \
         the catalog has sheaf.enqueue(queue text, payload jsonb, opts jsonb)",
    ),
    (
        "enqueue",
        "sheaf.enqueue(queue text, payload jsonb, opts jsonb): in schema sheaf but documented nowhere",
    ),
    (
        "find_task",
        "sheaf.find_task(text, text): returns text but the catalog says uuid",
    ),
    (
        "mutex_acquire",
        "sheaf.mutex_acquire(text, uuid, interval): returns TABLE(granted boolean, token bigint, \
         queue_position bigint) but the catalog says TABLE(granted boolean, token bigint, queue_position integer)",
    ),
    (
        "reap_expired",
        "sheaf.reap_expired(integer): max_rows DEFAULT 100 is 100 but the catalog's default is 1000",
    ),
    (
        "complete",
        "sheaf.complete(uuid, bigint, jsonb): result documented without a default",
    ),
    (
        "snooze",
        "sheaf.snooze(uuid, bigint, interval): arguments named (task_id, token, wait) \
         but the catalog names them (task_id, token, delay)",
    ),
    (
        "relay_pulled",
        "sheaf.relay_pulled(uuid): documented for worker but sheaf_worker may not call it",
    ),
    (
        "version",
        "sheaf.version(): documented for admin but sheaf_relay may call it too",
    ),
    ("mutex_leave", "sheaf.mutex_leave: `txet` is not a type"),
    (
        "mutex_reclaim",
        "a row of the reference that does not parse: \
         `sheaf.mutex_reclaim(max_rows int DEFAULT 1000` does not end with its argument list",
    ),
    (
        "mutex_reclaim",
        "sheaf.mutex_reclaim(max_rows integer): in schema sheaf but documented nowhere",
    ),
    (
        "mutex_status",
        "sheaf.mutex_status(key text): in schema sheaf but documented nowhere",
    ),
    (
        "new_id",
        "sheaf.new_id(): documented twice (also at docs/reference/sql/README.md:",
    ),
];

/// The reference with [`BREAKS`] made, mutex_status's row deleted and
/// new_id's written twice.
fn broken_reference() -> Vec<(String, String)> {
    let mut files = reference();
    for (from, to) in BREAKS {
        let file = files
            .iter_mut()
            .find(|(_, text)| text.contains(from))
            .unwrap_or_else(|| panic!("no page of the reference has {from:?}: update the test"));
        file.1 = file.1.replacen(from, to, 1);
    }
    for (_, text) in &mut files {
        let mut kept = Vec::new();
        for line in text.lines() {
            if line.starts_with("| `sheaf.mutex_status(") {
                continue;
            }
            kept.push(line);
            if line.starts_with("| `sheaf.new_id()`") {
                kept.push(line);
            }
        }
        *text = kept.join("\n");
    }
    files
}

/// The check fails where it should: on a copy of the reference broken in
/// each way it can drift, it reports every break, and nothing about a row
/// left as it was.
#[tokio::test]
async fn the_check_catches_a_drifted_reference() {
    let files = broken_reference();
    let mut db = shard_client().await;
    let problems = differences(&mut db, &files).await;
    let missed: Vec<&str> = EXPECTED
        .iter()
        .filter(|(_, e)| !problems.iter().any(|p| p.contains(*e)))
        .map(|(_, e)| *e)
        .collect();
    assert!(
        missed.is_empty(),
        "the check missed {missed:#?}\nit reported:\n  {}",
        problems.join("\n  ")
    );
    let collateral: Vec<&String> = problems
        .iter()
        .filter(|p| {
            !EXPECTED.iter().any(|(name, _)| {
                p.contains(&format!("sheaf.{name}(")) || p.contains(&format!("sheaf.{name}:"))
            })
        })
        .collect();
    assert!(
        collateral.is_empty(),
        "the check reported rows that were not broken:\n  {collateral:#?}"
    );
}
