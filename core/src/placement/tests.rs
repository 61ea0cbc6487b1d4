use super::*;
use serde_json::json;

const VECTORS: &str = include_str!("../../testdata/placement_vectors.json");

/// The topologies the vectors route over, as a client would send them
/// (some leave out the sets that take their defaults).
fn topologies() -> Vec<(&'static str, Value)> {
    vec![
        ("three", json!({"shards": [2, 0, 1]})),
        ("rollout", json!({"shards": [0, 1, 2, 3], "writable": [0, 1, 2]})),
        (
            "cells",
            json!({
                "shards": [0, 1, 2, 3, 4, 5],
                "writable": [0, 1, 2, 4, 5],
                "reserved": [4],
                "default": 1,
                "residency": {"eu": 4, "us": 1, "ap\"\u{e9}": 3},
                "forwards": {"9": 0, "10": 2, "65534": 5}
            }),
        ),
        ("drained", json!({"shards": [0, 1], "writable": []})),
        ("tenants", json!({"shards": [0, 1, 2, 3], "tenants": "together"})),
    ]
}

fn placements() -> Vec<Value> {
    vec![
        json!({}),
        json!({"tenant": "acme"}),
        json!({"tenant": " "}),
        json!({"routing_key": "acme"}),
        json!({"routing_key": "acme", "tenant": "other"}),
        json!({"routing_key": ""}),
        json!({"shard": 1}),
        json!({"shard": 3}),
        json!({"shard": 4, "routing_key": "ignored"}),
        json!({"shard": 7}),
        json!({"residency_key": "eu"}),
        json!({"residency_key": "us"}),
        json!({"residency_key": "ap\"\u{e9}"}),
        json!({"residency_key": "mars"}),
        json!({"residency_key": ""}),
    ]
}

fn answer(result: Result<Option<u16>, PlaceError>) -> Value {
    match result {
        Ok(owner) => json!({"owner": owner}),
        Err(e) => json!({"error": e.code()}),
    }
}

/// The vectors as this implementation computes them.
fn compute() -> Value {
    let mut tops = vec![];
    let mut starts = vec![];
    let mut tasks = vec![];
    let mut mutexes = vec![];
    let mut ids = vec![];
    for (name, input) in topologies() {
        let p = Projection::from_json(&input).expect("a vector topology is valid");
        tops.push(
            json!({"name": name, "projection": input, "canonical": p.canonical(), "digest": p.digest()}),
        );
        for placement in placements() {
            let (pin, tenant) = placement_from_json(&placement).expect("a vector placement parses");
            for (wf, id) in [
                ("order_flow", "order-42"),
                ("billing", "inv-7"),
                ("émoji", "✓"),
                ("wf", "x"),
            ] {
                let mut v =
                    json!({"topology": name, "workflow_name": wf, "workflow_id": id, "placement": placement});
                let got = p.place_start(wf, id, &pin, tenant.as_deref(), None);
                v.as_object_mut()
                    .unwrap()
                    .extend(answer(got.map(Some)).as_object().unwrap().clone());
                starts.push(v);
            }
            // A task takes no tenant (the shards refuse one): none here.
            let task_placements = if placement.get("tenant").is_some() {
                vec![]
            } else {
                vec![()]
            };
            for ((queue, idem, limit, rate), ()) in [
                ("emails", Some("msg-1"), None, None),
                ("emails", Some("msg-2"), Some("smtp"), Some("acme")),
                ("emails", None, Some("smtp"), Some("acme")),
                ("emails", None, Some("smtp"), None),
                ("emails", None, None, None),
            ]
            .into_iter()
            .flat_map(|t| task_placements.iter().map(move |&u| (t, u)))
            {
                let mut v = json!({"topology": name, "queue": queue, "idempotency_key": idem, "rate_limit": limit, "rate_key": rate, "placement": placement});
                let got = p.place_task(queue, idem, limit, rate, &pin);
                v.as_object_mut()
                    .unwrap()
                    .extend(answer(got).as_object().unwrap().clone());
                tasks.push(v);
            }
        }
        for (wf, key) in [("digest", "user-1"), ("digest", "user-2"), ("report", "r")] {
            for placement in [json!({}), json!({"tenant": "acme"})] {
                let (pin, tenant) = placement_from_json(&placement).unwrap();
                let mut v = json!({"topology": name, "workflow_name": wf, "workflow_id": "any", "debounce_key": key, "placement": placement});
                let got = p.place_start(wf, "any", &pin, tenant.as_deref(), Some(key));
                v.as_object_mut()
                    .unwrap()
                    .extend(answer(got.map(Some)).as_object().unwrap().clone());
                starts.push(v);
            }
        }
        for key in ["payments", "acct:42", "a", "ключ"] {
            mutexes.push(json!({"topology": name, "mutex_key": key, "owner": p.place_mutex(key)}));
        }
        for origin in [0u16, 1, 2, 3, 5, 9, 10, 65534, UNENCODED_SHARD] {
            let id = crate::id::compose(origin, 1_767_225_600_000, 0x0123_4567_89ab_cdef).unwrap();
            let id = uuid::Uuid::from_bytes(id);
            ids.push(json!({"topology": name, "id": id.to_string(), "owner": p.route_origin(origin)}));
        }
    }
    json!({
        "about": "Placement vectors: docs/reference/placement.md. Regenerate with SHEAF_BLESS=1 cargo test -p sheaf-core placement",
        "topologies": tops,
        "starts": starts,
        "tasks": tasks,
        "mutexes": mutexes,
        "ids": ids,
    })
}

#[test]
fn matches_the_shared_vectors() {
    let computed = compute();
    if std::env::var_os("SHEAF_BLESS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/placement_vectors.json");
        let text = serde_json::to_string_pretty(&computed).unwrap() + "\n";
        std::fs::write(path, text).expect("writing the vectors");
        return;
    }
    let stored: Value = serde_json::from_str(VECTORS).expect("the vectors parse");
    assert_eq!(
        stored, computed,
        "core/testdata/placement_vectors.json differs (SHEAF_BLESS=1 rewrites it)"
    );
}

#[test]
fn the_canonical_form_is_the_drivers_projection() {
    let p = Projection::from_json(&json!({
        "shards": [3, 1, 0, 2], "reserved": [3], "residency": {"us": 2, "eu": 1}
    }))
    .unwrap();
    assert_eq!(
        p.canonical(),
        r#"{"shards":[0,1,2,3],"readable":[0,1,2,3],"writable":[0,1,2,3],"reserved":[3],"default":0,"residency":{"eu":1,"us":2},"forwards":{}}"#
    );
    assert_eq!(
        Projection::from_json(&serde_json::from_str(&p.canonical()).unwrap()).unwrap(),
        p
    );
    let forwards = Projection::from_json(&json!({"shards": [0], "forwards": {"10": 0, "9": 0}})).unwrap();
    assert!(
        forwards.canonical().ends_with(r#""forwards":{"9":0,"10":0}}"#),
        "numeric order"
    );
}

#[test]
fn bad_projections_are_named() {
    use ProjectionError::*;
    let cases = [
        (json!([]), NotAnObject),
        (json!({"shards": [0], "urls": {}}), UnknownField("urls".into())),
        (json!({"shards": []}), Empty),
        (json!({"shards": [0, 0]}), DuplicateId(0)),
        (json!({"shards": [65535]}), IdOutOfRange(65535)),
        (
            json!({"shards": [0], "writable": [1]}),
            UnknownShard {
                set: "writable",
                shard: 1,
            },
        ),
        (
            json!({"shards": [0, 1], "readable": [0], "writable": [1]}),
            WritableNotReadable(1),
        ),
        (
            json!({"shards": [0, 1], "reserved": [0], "default": 0}),
            ReservedDefault(0),
        ),
        (
            json!({"shards": [0, 1], "reserved": [0, 1]}),
            ReservedCoverWritable,
        ),
        (json!({"shards": [0], "residency": {" ": 0}}), BlankResidencyKey),
        (
            json!({"shards": [0], "forwards": {"0": 0}}),
            ForwardFromListed { from: 0, to: 0 },
        ),
        (
            json!({"shards": [0, 1], "readable": [0], "writable": [0], "forwards": {"5": 1}}),
            ForwardNotReadable { from: 5, to: 1 },
        ),
    ];
    for (input, want) in cases {
        assert_eq!(Projection::from_json(&input), Err(want), "{input}");
    }
    assert!(matches!(
        Projection::from_json(&json!({"shards": "0"})),
        Err(BadField { field: "shards", .. })
    ));
}

#[test]
fn bad_placements_are_named() {
    for (input, needle) in [
        (json!(1), "must be an object"),
        (json!({"shard": -1}), "shard must be"),
        (json!({"shard": 65535}), "shard must be"),
        (json!({"tenant": 3}), "tenant must be a string"),
        (json!({"region": "eu"}), "unknown field"),
        (json!({"shard": 1, "residency_key": "eu"}), "not both"),
    ] {
        let err = placement_from_json(&input).unwrap_err();
        assert!(err.contains(needle), "{input}: {err}");
    }
}

#[test]
fn a_retired_shard_forwards_its_ids_and_mutexes() {
    let p = Projection::from_json(&json!({"shards": [0, 1], "forwards": {"7": 1}})).unwrap();
    assert_eq!(p.route_origin(7), 1);
    assert_eq!(p.route_origin(0), 0);
    assert_eq!(p.route_origin(UNENCODED_SHARD), 0, "the default shard");
}

fn projection(v: Value) -> Projection {
    Projection::from_json(&v).unwrap()
}

/// A shard takes what a projection it accepts places on it, or what
/// nothing places; else it names the published projection's owner, or
/// that projection's refusal.
#[test]
fn a_shard_admits_what_an_accepted_projection_places_on_it() {
    let two = projection(json!({"shards": [1, 2]}));
    let one = projection(json!({"shards": [1]}));
    // A workflow id owned by each of the two shards.
    let owned_by = |id: u16| {
        (0..1000)
            .map(|n| format!("w{n}"))
            .find(|w| two.place("order", w, &Pin::Auto, None) == Ok(id))
            .unwrap()
    };
    let (on1, on2) = (owned_by(1), owned_by(2));
    fn start(w: &str) -> impl Fn(&Projection) -> Result<Option<u16>, PlaceError> + '_ {
        move |p| p.place("order", w, &Pin::Auto, None).map(Some)
    }
    assert_eq!(admit(1, &two, None, start(&on1)), Admission::Here);
    assert_eq!(admit(1, &two, None, start(&on2)), Admission::Elsewhere(2));
    assert_eq!(admit(2, &two, None, start(&on2)), Admission::Here);
    // While a change rolls out, the previous projection's owner still takes it.
    assert_eq!(admit(1, &two, Some(&one), start(&on2)), Admission::Here);
    assert_eq!(admit(2, &one, Some(&two), start(&on2)), Admission::Here);
    // A pin is placement the call says: the pinned shard takes it.
    let pinned = |p: &Projection| p.place("order", &on2, &Pin::Shard(1), None).map(Some);
    assert_eq!(admit(1, &two, None, pinned), Admission::Here);
    assert_eq!(admit(2, &two, None, pinned), Admission::Elsewhere(1));
    // A placement the published projection refuses is refused as such.
    let unknown = |p: &Projection| p.place("order", &on1, &Pin::Shard(7), None).map(Some);
    assert_eq!(
        admit(1, &two, None, unknown),
        Admission::Refused(PlaceError::UnknownShard(7))
    );
    // Nothing places an unkeyed task: any shard takes it.
    let unkeyed = |p: &Projection| p.place_task("q", None, None, None, &Pin::Auto);
    assert_eq!(admit(2, &two, None, unkeyed), Admission::Here);
}

#[test]
fn a_placement_reads_back_as_written() {
    for v in placements() {
        let Ok((pin, tenant)) = placement_from_json(&v) else {
            continue;
        };
        let written = placement_to_json(&pin, tenant.as_deref());
        assert_eq!(placement_from_json(&written), Ok((pin, tenant)), "{v}");
    }
    assert_eq!(placement_to_json(&Pin::Auto, None), json!({}));
}

#[test]
fn a_tenant_placement_keeps_a_tenants_runs_together_and_only_then_changes_the_digest() {
    let per = projection(json!({"shards": [0, 1, 2, 3, 4, 5, 6, 7]}));
    let explicit = projection(json!({"shards": [0, 1, 2, 3, 4, 5, 6, 7], "tenants": "per_workflow"}));
    let together = projection(json!({"shards": [0, 1, 2, 3, 4, 5, 6, 7], "tenants": "together"}));
    assert_eq!(per.digest(), explicit.digest(), "the default is not written");
    assert_ne!(per.digest(), together.digest());
    assert!(together.canonical().ends_with(r#","tenants":"together"}"#));
    assert_eq!(
        Projection::from_json(&serde_json::from_str(&together.canonical()).unwrap()),
        Ok(together.clone())
    );
    let homes = |p: &Projection| {
        ["orders", "invoices", "emails", "reports", "exports"]
            .iter()
            .map(|wf| p.place(wf, "any", &Pin::Auto, Some("acme")).unwrap())
            .collect::<BTreeSet<u16>>()
    };
    assert_eq!(
        homes(&together).len(),
        1,
        "every workflow of the tenant on one shard"
    );
    assert!(homes(&per).len() > 1, "per workflow: spread");
    assert_eq!(
        Projection::from_json(&json!({"shards": [0], "tenants": "apart"})),
        Err(ProjectionError::BadField {
            field: "tenants",
            why: "\"per_workflow\" or \"together\""
        })
    );
}
