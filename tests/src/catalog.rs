//! A normalized dump of everything the extension defines in a database, for
//! comparing an upgraded database with a fresh install: one line per object
//! or property, sorted, with no oids, no column positions (columns compare by
//! name) and no data. Roles are cluster-wide: dump them before a fresh
//! install on the same cluster could create what an upgrade forgot.

use tokio_postgres::Client;

/// Renders an `aclitem[]` expression: `default` for NULL (the built-in
/// privileges), else its entries sorted.
fn acl(expr: &str) -> String {
    format!(
        "CASE WHEN {expr} IS NULL THEN 'default' ELSE '[' || coalesce((\
           SELECT string_agg(format('%s:%s%s(by %s)', \
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END, \
                    a.privilege_type, CASE WHEN a.is_grantable THEN '*' ELSE '' END, \
                    pg_catalog.pg_get_userbyid(a.grantor)), ', ' ORDER BY 1) \
           FROM pg_catalog.aclexplode({expr}) a), '') || ']' END"
    )
}

/// Newlines and tabs made visible, so a multi-line body stays one line.
fn one_line(expr: &str) -> String {
    format!("replace(replace(replace({expr}, E'\\\\', E'\\\\\\\\'), E'\\n', E'\\\\n'), E'\\t', E'\\\\t')")
}

const NS: &str = "(SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'sheaf')";
const EXT: &str = "(SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'sheaf')";

/// One query per kind of catalog object, each returning one text column.
fn queries() -> Vec<(&'static str, String)> {
    [tables(), definitions(), rules(), grants()].concat()
}

/// The schema, the extension and its members, relations and their columns.
fn tables() -> Vec<(&'static str, String)> {
    vec![
        (
            "schema",
            format!(
                "SELECT format('schema %s owner=%s acl=%s', n.nspname, pg_catalog.pg_get_userbyid(n.nspowner), {}) \
                 FROM pg_catalog.pg_namespace n WHERE n.oid = {NS}",
                acl("n.nspacl")
            ),
        ),
        (
            "extension",
            format!(
                "SELECT format('extension %s version=%s schema=%s relocatable=%s owner=%s config=%s conditions=%s', \
                    e.extname, e.extversion, e.extnamespace::regnamespace, e.extrelocatable, \
                    pg_catalog.pg_get_userbyid(e.extowner), \
                    (SELECT array_agg(c::regclass::text ORDER BY c::regclass::text) FROM unnest(e.extconfig) c), \
                    e.extcondition) \
                 FROM pg_catalog.pg_extension e WHERE e.oid = {EXT}"
            ),
        ),
        (
            "member",
            format!(
                "SELECT 'member ' || pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) \
                 FROM pg_catalog.pg_depend d \
                 WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = {EXT} AND d.deptype = 'e'"
            ),
        ),
        (
            "relation",
            format!(
                "SELECT format('relation %s kind=%s persistence=%s options=%s owner=%s acl=%s rls=%s,%s replica_identity=%s', \
                    c.relname, c.relkind, c.relpersistence, \
                    coalesce((SELECT array_agg(o ORDER BY o) FROM unnest(c.reloptions) o)::text, '{{}}'), \
                    pg_catalog.pg_get_userbyid(c.relowner), {}, c.relrowsecurity, c.relforcerowsecurity, c.relreplident) \
                 FROM pg_catalog.pg_class c WHERE c.relnamespace = {NS}",
                acl("c.relacl")
            ),
        ),
        // Column options without `pg_attver=<n>`: this machine's PostgreSQL
        // builds stamp it on every column (catalog views too) with a value
        // that differs per creation; it is not something sheaf sets.
        (
            "column",
            format!(
                "SELECT format('column %s.%s type=%s not_null=%s default=%s identity=%s generated=%s collation=%s storage=%s options=%s acl=%s', \
                    c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                    coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '-'), a.attidentity, a.attgenerated, \
                    coalesce(co.collname, '-'), a.attstorage, \
                    coalesce((SELECT array_agg(o ORDER BY o) FROM unnest(a.attoptions) o WHERE o NOT LIKE 'pg\\_attver=%')::text, '{{}}'), {}) \
                 FROM pg_catalog.pg_attribute a \
                 JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
                 LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                 LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation \
                 WHERE c.relnamespace = {NS} AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c') \
                   AND a.attnum > 0 AND NOT a.attisdropped",
                acl("a.attacl")
            ),
        ),
    ]
}

/// Indexes, constraints, sequences, functions and types.
fn definitions() -> Vec<(&'static str, String)> {
    vec![
        (
            "index",
            format!(
                "SELECT format('index %s primary=%s replica_identity=%s clustered=%s valid=%s', \
                    pg_catalog.pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisreplident, i.indisclustered, i.indisvalid) \
                 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid \
                 WHERE c.relnamespace = {NS}"
            ),
        ),
        (
            "constraint",
            format!(
                "SELECT format('constraint %s on %s: %s deferrable=%s deferred=%s validated=%s no_inherit=%s', \
                    k.conname, CASE WHEN k.conrelid <> 0 THEN k.conrelid::regclass::text ELSE 'type ' || k.contypid::regtype::text END, \
                    pg_catalog.pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred, k.convalidated, k.connoinherit) \
                 FROM pg_catalog.pg_constraint k WHERE k.connamespace = {NS}"
            ),
        ),
        (
            "sequence",
            format!(
                "SELECT format('sequence %s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s owned_by=%s', \
                    c.relname, pg_catalog.format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, \
                    s.seqcache, s.seqcycle, \
                    coalesce((SELECT d.refobjid::regclass::text || '.' || a.attname \
                              FROM pg_catalog.pg_depend d \
                              JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid \
                              WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid \
                                AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.deptype IN ('a', 'i')), '-')) \
                 FROM pg_catalog.pg_sequence s JOIN pg_catalog.pg_class c ON c.oid = s.seqrelid \
                 WHERE c.relnamespace = {NS}"
            ),
        ),
        (
            "function",
            format!(
                "SELECT format('function %s(%s) returns %s kind=%s language=%s volatility=%s strict=%s security_definer=%s \
                               leakproof=%s parallel=%s cost=%s rows=%s config=%s owner=%s source=%s library=%s acl=%s', \
                    p.proname, pg_catalog.pg_get_function_arguments(p.oid), \
                    coalesce(pg_catalog.pg_get_function_result(p.oid), '-'), p.prokind, l.lanname, p.provolatile, \
                    p.proisstrict, p.prosecdef, p.proleakproof, p.proparallel, p.procost, p.prorows, \
                    coalesce(p.proconfig::text, '{{}}'), pg_catalog.pg_get_userbyid(p.proowner), \
                    {}, coalesce(p.probin, '-'), {}) \
                 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
                 WHERE p.pronamespace = {NS}",
                one_line("p.prosrc"),
                acl("p.proacl")
            ),
        ),
        (
            "type",
            format!(
                "SELECT format('type %s kind=%s category=%s owner=%s acl=%s base=%s not_null=%s default=%s labels=%s', \
                    t.typname, t.typtype, t.typcategory, pg_catalog.pg_get_userbyid(t.typowner), {}, \
                    CASE WHEN t.typbasetype <> 0 THEN pg_catalog.format_type(t.typbasetype, t.typtypmod) ELSE '-' END, \
                    t.typnotnull, coalesce(t.typdefault, '-'), \
                    coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) \
                              FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '-')) \
                 FROM pg_catalog.pg_type t WHERE t.typnamespace = {NS}",
                acl("t.typacl")
            ),
        ),
    ]
}

/// Triggers, policies, views, rules and statistics.
fn rules() -> Vec<(&'static str, String)> {
    vec![
        (
            "trigger",
            format!(
                "SELECT format('trigger %s enabled=%s', pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled) \
                 FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
                 WHERE c.relnamespace = {NS} AND NOT t.tgisinternal"
            ),
        ),
        (
            "policy",
            format!(
                "SELECT format('policy %s on %s command=%s permissive=%s roles=%s using=%s check=%s', \
                    p.polname, c.relname, p.polcmd, p.polpermissive, \
                    (SELECT array_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(r) END ORDER BY 1) FROM unnest(p.polroles) r), \
                    coalesce(pg_catalog.pg_get_expr(p.polqual, p.polrelid), '-'), \
                    coalesce(pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid), '-')) \
                 FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class c ON c.oid = p.polrelid \
                 WHERE c.relnamespace = {NS}"
            ),
        ),
        (
            "view",
            format!(
                "SELECT format('view %s: %s', c.relname, {}) \
                 FROM pg_catalog.pg_class c WHERE c.relnamespace = {NS} AND c.relkind IN ('v', 'm')",
                one_line("pg_catalog.pg_get_viewdef(c.oid)")
            ),
        ),
        (
            "rule",
            format!(
                "SELECT format('rule %s', {}) FROM pg_catalog.pg_rules WHERE schemaname = 'sheaf'",
                one_line("definition")
            ),
        ),
        (
            "statistics",
            format!(
                "SELECT format('statistics %s on %s kinds=%s columns=%s', s.stxname, s.stxrelid::regclass, s.stxkind, s.stxkeys) \
                 FROM pg_catalog.pg_statistic_ext s WHERE s.stxnamespace = {NS}"
            ),
        ),
    ]
}

/// Default privileges, comments and roles.
fn grants() -> Vec<(&'static str, String)> {
    vec![
        (
            "default privileges",
            format!(
                "SELECT format('default privileges for %s of role %s: %s', d.defaclobjtype, \
                    pg_catalog.pg_get_userbyid(d.defaclrole), {}) \
                 FROM pg_catalog.pg_default_acl d WHERE d.defaclnamespace = {NS}",
                acl("d.defaclacl")
            ),
        ),
        (
            "comment",
            format!(
                "SELECT format('comment on %s: %s', pg_catalog.pg_describe_object(d.classoid, d.objoid, d.objsubid), {}) \
                 FROM pg_catalog.pg_description d \
                 WHERE (d.classoid = 'pg_catalog.pg_extension'::regclass AND d.objoid = {EXT}) \
                    OR (d.classoid, d.objoid) IN (SELECT classid, objid FROM pg_catalog.pg_depend \
                        WHERE refclassid = 'pg_catalog.pg_extension'::regclass AND refobjid = {EXT} AND deptype = 'e') \
                    OR (d.classoid = 'pg_catalog.pg_namespace'::regclass AND d.objoid = {NS})",
                one_line("d.description")
            ),
        ),
        (
            "role",
            "SELECT format('role %s super=%s inherit=%s create_role=%s create_db=%s login=%s replication=%s \
                            bypass_rls=%s connection_limit=%s member_of=%s', \
                r.rolname, r.rolsuper, r.rolinherit, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin, \
                r.rolreplication, r.rolbypassrls, r.rolconnlimit, \
                coalesce((SELECT string_agg(g.rolname || CASE WHEN m.admin_option THEN '(admin)' ELSE '' END, ',' ORDER BY g.rolname) \
                          FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles g ON g.oid = m.roleid \
                          WHERE m.member = r.oid), '-')) \
             FROM pg_catalog.pg_roles r WHERE r.rolname LIKE 'sheaf\\_%'"
                .to_owned(),
        ),
    ]
}

/// The normalized dump, sorted.
pub async fn dump(db: &Client) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    for (what, sql) in queries() {
        let rows = db.query(sql.as_str(), &[]).await.map_err(|e| {
            let detail = e.as_db_error().map(|d| d.message().to_owned());
            format!(
                "dumping the {what}s: {}\n{sql}",
                detail.unwrap_or_else(|| e.to_string())
            )
        })?;
        lines.extend(rows.iter().map(|r| r.get::<_, String>(0)));
    }
    lines.sort();
    Ok(lines)
}

/// The lines only in `left` (`-`) or only in `right` (`+`), interleaved in
/// sort order so both versions of a changed object sit side by side. Empty
/// when the two dumps are equal.
pub fn diff(left: &[String], right: &[String]) -> Vec<String> {
    let mut out: Vec<(&str, char)> = Vec::new();
    for l in left {
        if right.binary_search(l).is_err() {
            out.push((l, '-'));
        }
    }
    for r in right {
        if left.binary_search(r).is_err() {
            out.push((r, '+'));
        }
    }
    out.sort();
    out.into_iter().map(|(l, sign)| format!("{sign} {l}")).collect()
}
