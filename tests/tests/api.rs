//! The HTTP API (`sheaf serve`, `/api/v1`), driven over HTTP with a real
//! client: every endpoint's happy path and its refusals (no token, a read
//! token on an act endpoint, a bad parameter named, an unknown id), and the
//! OpenAPI document checked against the routes.

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sheaf_driver::{Client, EnqueueOptions, ExecutionId, PoolOptions, ShardId};
use sheaf_tests::{dead_letters, fleet, unique};
use sheaf_web::{UiOptions, UiServer};

const READ: &str = "read-token-0123456789";
const ACT: &str = "act-token-0123456789ab";

/// A served API with one read and one act token (or none).
struct Api {
    server: UiServer,
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn start(client: Arc<Client>, tokens: bool) -> Api {
        let options = if tokens {
            UiOptions::default().api_tokens(vec![READ.to_owned()], vec![ACT.to_owned()])
        } else {
            UiOptions::default()
        };
        let server = UiServer::start(client, "127.0.0.1:0".parse().expect("an address"), options)
            .await
            .expect("the server starts");
        let base = format!("http://{}", server.local_addr());
        Api {
            server,
            base,
            http: reqwest::Client::new(),
        }
    }

    /// `method path` with `token` (if any) and a JSON `body` (if any): the
    /// status and the body read as JSON (null when not JSON).
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        if let Some(b) = body {
            request = request
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let response = request.send().await.expect("an answer");
        let status = response.status();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(token), None).await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    async fn stop(self) {
        self.server.shutdown().await;
    }
}

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

/// The error's code and message of a refusal, checked for its shape.
fn refusal(body: &Value) -> (&str, &str) {
    let e = &body["error"];
    assert!(
        e["sqlstate"].is_null() || e["sqlstate"].as_str().is_some_and(|s| s.len() == 5),
        "{body}"
    );
    (
        e["code"]
            .as_str()
            .unwrap_or_else(|| panic!("an error code: {body}")),
        e["message"]
            .as_str()
            .unwrap_or_else(|| panic!("an error message: {body}")),
    )
}

/// Asserts a 400 whose message names `parameter`.
fn bad(answer: (StatusCode, Value), parameter: &str) {
    assert_eq!(answer.0, StatusCode::BAD_REQUEST, "{}", answer.1);
    let (code, message) = refusal(&answer.1);
    assert_eq!(code, "invalid_parameter_value");
    assert!(message.starts_with(parameter), "names {parameter}: {message}");
}

fn first_shard() -> ShardId {
    fleet().shards().next().expect("a shard").id
}

#[tokio::test]
async fn the_document_matches_the_routes() {
    let api = Api::start(client(), true).await;
    let (status, doc) = api.call(Method::GET, "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
    let paths = doc["paths"].as_object().expect("paths");
    let mut operations = 0;
    for (path, item) in paths {
        let concrete = path
            .replace("{id}", "not-an-id")
            .replace("{name}", "nosuch")
            .replace("{workflow_id}", "nosuch");
        for method in item.as_object().expect("a path item").keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
            let (status, body) = api
                .call(method.clone(), &concrete, Some(ACT), Some(json!({})))
                .await;
            // Documented: the route answers; a 404 is the handler's own
            // refusal (a JSON error), not the router's.
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            if status == StatusCode::NOT_FOUND {
                refusal(&body);
            }
            operations += 1;
        }
    }
    assert!(operations >= 25, "every endpoint documented: {operations}");
    // The check can fail: a method no route has is refused by the router.
    let (status, _) = api
        .call(Method::DELETE, "/api/v1/executions", Some(ACT), None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, body) = api.get("/api/v1/nosuch", ACT).await;
    assert_eq!((status, body), (StatusCode::NOT_FOUND, Value::Null));
    api.stop().await;
}

#[tokio::test]
async fn tokens_are_required_and_scoped() {
    let closed = Api::start(client(), false).await;
    let (status, body) = closed.get("/api/v1/queues", READ).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no token configured: closed");
    assert!(refusal(&body).1.contains("SHEAF_API_READ_TOKENS"));
    let (status, _) = closed.call(Method::GET, "/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "the liveness probe needs no token");
    closed.stop().await;

    let api = Api::start(client(), true).await;
    let (status, body) = api.call(Method::GET, "/api/v1/queues", None, None).await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    let (status, _) = api.get("/api/v1/queues", "wrong-token-0123456789").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = api.get("/api/v1/queues", READ).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.get("/api/v1/queues", ACT).await;
    assert_eq!(status, StatusCode::OK, "act implies read");
    let queue = unique("api-scope");
    let (status, body) = api.post("/api/v1/tasks", READ, json!({ "queue": queue })).await;
    assert_eq!((status, refusal(&body).0), (StatusCode::FORBIDDEN, "forbidden"));
    for (method, path) in [
        (Method::POST, "/api/v1/executions"),
        (Method::POST, "/api/v1/dead-letters/purge"),
        (Method::DELETE, "/api/v1/rate-limits/x/override"),
    ] {
        let (status, _) = api.call(method.clone(), path, Some(READ), Some(json!({}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}");
    }
    // Nothing was enqueued by the refused call.
    let (_, page) = api.get(&format!("/api/v1/tasks?queue={queue}"), READ).await;
    assert_eq!(page["items"], json!([]));
    // A read token sees the fleet's counts, not its shards.
    let (_, read_view) = api.get("/api/v1/fleet", READ).await;
    assert!(read_view.get("per_shard").is_none(), "{read_view}");
    let (_, act_view) = api.get("/api/v1/fleet", ACT).await;
    assert_eq!(
        act_view["per_shard"].as_array().map(Vec::len),
        Some(fleet().shards().count())
    );
    api.stop().await;
}

#[tokio::test]
async fn executions_are_started_read_and_listed() {
    let api = Api::start(client(), true).await;
    let name = unique("api-wf");
    let mut ids = Vec::new();
    for key in ["a", "b"] {
        let (status, started) = api
            .post(
                "/api/v1/executions",
                ACT,
                json!({ "workflow_name": name, "workflow_id": key, "input": { "k": key } }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{started}");
        assert_eq!(started["created"], json!(true));
        ids.push(started["execution_id"].as_str().expect("an id").to_owned());
    }
    let (_, again) = api
        .post(
            "/api/v1/executions",
            ACT,
            json!({ "workflow_name": name, "workflow_id": "a" }),
        )
        .await;
    assert_eq!(
        (again["created"].clone(), again["execution_id"].clone()),
        (json!(false), json!(ids[0]))
    );
    let (status, one) = api.get(&format!("/api/v1/executions/{}", ids[0]), READ).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (one["workflow_id"].clone(), one["input"].clone()),
        (json!("a"), json!({ "k": "a" }))
    );

    // Keyset paging: one a page, the cursor to the next, no repeats.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = api
            .get(
                &format!("/api/v1/executions?workflow={name}&page_size=1&order=asc&cursor={cursor}"),
                READ,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["partial"], json!(false));
        for item in page["items"].as_array().expect("items") {
            seen.push(item["workflow_id"].as_str().expect("a key").to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["a", "b"]);

    let (status, found) = api.get(&format!("/api/v1/workflows/{name}/b"), READ).await;
    assert_eq!(
        (status, found["execution_id"].clone()),
        (StatusCode::OK, json!(ids[1]))
    );
    let (status, history) = api
        .get(
            &format!("/api/v1/executions/{}/history?page_size=10", ids[0]),
            READ,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !history["events"].as_array().expect("events").is_empty(),
        "{history}"
    );

    api.stop().await;
}

/// Starts `a`, `b` and `c` of a new workflow (`c` on the first shard):
/// the workflow's name and the ids.
async fn three_runs(api: &Api) -> (String, Vec<String>) {
    let name = unique("api-wf");
    let mut ids = Vec::new();
    for (key, shard) in [("a", None), ("b", None), ("c", Some(first_shard().get()))] {
        let (status, started) = api
            .post(
                "/api/v1/executions",
                ACT,
                json!({ "workflow_name": name, "workflow_id": key, "shard": shard }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{started}");
        if let Some(shard) = shard {
            assert_eq!(started["shard"], json!(shard), "placed as asked");
        }
        ids.push(started["execution_id"].as_str().expect("an id").to_owned());
    }
    (name, ids)
}

/// Each run's shard audited the action done to it, with the API's actor;
/// a signal by its name, never its payload.
async fn audited_as_api(done: &[(&String, &str)]) {
    let c = client();
    for &(id, action) in done {
        let run: ExecutionId = id.parse().expect("an id");
        let shard = c
            .get_execution(run)
            .await
            .expect("a read")
            .expect("the run")
            .shard;
        let log = c
            .admin()
            .audit_log(shard, None, 1000)
            .await
            .expect("the audit log");
        let entry = log
            .iter()
            .find(|e| e.action == action && e.target.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{action} on {id} audited"));
        assert_eq!(entry.actor, "api");
        let detail = entry.detail.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(!detail.contains("payload"), "{detail}");
    }
}

#[tokio::test]
async fn executions_by_id_and_by_key_are_acted_on() {
    let api = Api::start(client(), true).await;
    let (name, ids) = three_runs(&api).await;
    let (status, signalled) = api
        .post(
            &format!("/api/v1/executions/{}/signal", ids[0]),
            ACT,
            json!({ "name": "go", "payload": 1, "signal_id": "s1" }),
        )
        .await;
    assert_eq!(
        (status, signalled["changed"].clone()),
        (StatusCode::OK, json!(true)),
        "{signalled}"
    );
    let (_, by_key) = api
        .post(
            &format!("/api/v1/workflows/{name}/a/signal"),
            ACT,
            json!({ "name": "go", "signal_id": "s2" }),
        )
        .await;
    assert_eq!(by_key["execution_id"], json!(ids[0]));
    let (status, cancelled) = api
        .post(
            &format!("/api/v1/workflows/{name}/a/cancel"),
            ACT,
            json!({ "reason": "api test" }),
        )
        .await;
    assert_eq!(
        (status, cancelled["changed"].clone()),
        (StatusCode::OK, json!(true))
    );
    let (status, _) = api
        .post(&format!("/api/v1/executions/{}/cancel", ids[1]), ACT, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, one) = api.get(&format!("/api/v1/executions/{}", ids[0]), READ).await;
    assert_eq!(one["state"], json!("CANCELLED"));
    let (status, terminated) = api
        .post(&format!("/api/v1/workflows/{name}/c/terminate"), ACT, json!({}))
        .await;
    assert_eq!(
        (status, terminated["changed"].clone()),
        (StatusCode::OK, json!(true))
    );
    let (status, again) = api
        .post(
            &format!("/api/v1/executions/{}/terminate", ids[2]),
            ACT,
            json!({}),
        )
        .await;
    assert_eq!(
        (status, again["changed"].clone()),
        (StatusCode::OK, json!(false)),
        "already ended"
    );
    audited_as_api(&[
        (&ids[0], "signal"),
        (&ids[0], "cancel_execution"),
        (&ids[1], "cancel_execution"),
        (&ids[2], "terminate_execution"),
    ])
    .await;

    let unknown = ExecutionId::mint(first_shard()).expect("an id");
    let (status, body) = api
        .post(&format!("/api/v1/executions/{unknown}/cancel"), ACT, json!({}))
        .await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::NOT_FOUND, "no_data_found")
    );
    api.stop().await;
}

#[tokio::test]
async fn execution_calls_refuse_what_is_wrong() {
    let api = Api::start(client(), true).await;
    let name = unique("api-wf");
    let unknown = ExecutionId::mint(first_shard()).expect("an id");
    let (status, body) = api.get(&format!("/api/v1/executions/{unknown}"), READ).await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::NOT_FOUND, "no_data_found")
    );
    let (status, _) = api.get(&format!("/api/v1/workflows/{name}/nosuch"), READ).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    bad(api.get("/api/v1/executions/nonsense", READ).await, "id");
    bad(api.get("/api/v1/executions?page_size=0", READ).await, "page_size");
    bad(api.get("/api/v1/executions?state=bogus", READ).await, "state");
    bad(
        api.get("/api/v1/executions?created_after=100y", READ).await,
        "created_after",
    );
    bad(api.get("/api/v1/executions?order=up", READ).await, "order");
    bad(api.get("/api/v1/executions?filter={", READ).await, "filter");
    bad(
        api.get(&format!("/api/v1/executions/{unknown}/history?after=x"), READ)
            .await,
        "after",
    );
    bad(
        api.post("/api/v1/executions", ACT, json!({ "workflow_name": name }))
            .await,
        "body",
    );
    bad(
        api.post(
            "/api/v1/executions",
            ACT,
            json!({ "workflow_name": name, "workflow_id": "d", "shard": 1, "routing_key": "k" }),
        )
        .await,
        "placement",
    );
    bad(
        api.post(
            "/api/v1/executions",
            ACT,
            json!({ "workflow_name": name, "workflow_id": "d", "run_at": "soon" }),
        )
        .await,
        "run_at",
    );
    let (status, body) = api
        .post(&format!("/api/v1/executions/{unknown}/cancel"), ACT, json!({}))
        .await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::NOT_FOUND, "no_data_found")
    );
    api.stop().await;
}

#[tokio::test]
async fn tasks_are_enqueued_listed_read_and_cancelled() {
    let c = client();
    let api = Api::start(c.clone(), true).await;
    let queue = unique("api-q");
    let (status, enqueued) = api
        .post(
            "/api/v1/tasks",
            ACT,
            json!({ "queue": queue, "payload": { "n": 1 }, "priority": 5 }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{enqueued}");
    let id = enqueued["task_id"].as_str().expect("a task id").to_owned();
    let (status, page) = api
        .get(&format!("/api/v1/tasks?queue={queue}&state=ready"), READ)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"][0]["task_id"], json!(id));
    let (status, task) = api.get(&format!("/api/v1/tasks/{id}"), READ).await;
    assert_eq!(
        (status, task["payload"].clone(), task["priority"].clone()),
        (StatusCode::OK, json!({ "n": 1 }), json!(5))
    );
    let (status, cancelled) = api
        .post(
            &format!("/api/v1/tasks/{id}/cancel"),
            ACT,
            json!({ "reason": "api test" }),
        )
        .await;
    assert_eq!(
        (status, cancelled["cancelled"].clone()),
        (StatusCode::OK, json!(true))
    );
    let (status, body) = api.get(&format!("/api/v1/tasks/{id}"), READ).await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::NOT_FOUND, "no_data_found")
    );
    bad(api.get("/api/v1/tasks", READ).await, "queue");
    bad(
        api.get(&format!("/api/v1/tasks?queue={queue}&state=bogus"), READ)
            .await,
        "state",
    );
    bad(api.get("/api/v1/tasks/nonsense", READ).await, "id");
    api.stop().await;
}

#[tokio::test]
async fn dead_letters_are_listed_redriven_and_purged() {
    let c = client();
    let api = Api::start(c.clone(), true).await;
    let queue = unique("api-dead");
    let dead = dead_letters(&c, &queue, first_shard(), 3, "boom").await;
    let (status, page) = api
        .get(&format!("/api/v1/dead-letters?queue={queue}&page_size=2"), READ)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2));
    assert!(page["next_cursor"].is_string(), "{page}");
    let (status, redriven) = api
        .post(
            "/api/v1/dead-letters/redrive",
            ACT,
            json!({ "task_ids": [dead[0].to_string()] }),
        )
        .await;
    assert_eq!(
        (status, redriven["count"].clone()),
        (StatusCode::OK, json!(1)),
        "{redriven}"
    );
    bad(
        api.post("/api/v1/dead-letters/redrive", ACT, json!({ "task_ids": ["x"] }))
            .await,
        "task_ids",
    );
    bad(
        api.post(
            "/api/v1/dead-letters/purge",
            ACT,
            json!({ "queue": queue, "older_than": "soon" }),
        )
        .await,
        "older_than",
    );
    let (status, purged) = api
        .post("/api/v1/dead-letters/purge", ACT, json!({ "queue": queue }))
        .await;
    assert_eq!(
        (status, purged["count"].clone()),
        (StatusCode::OK, json!(2)),
        "{purged}"
    );
    api.stop().await;
}

#[tokio::test]
async fn queues_and_schedules_are_listed() {
    let c = client();
    let api = Api::start(c.clone(), true).await;
    let queue = unique("api-fleet");
    c.enqueue(&queue, json!(null), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (status, queues) = api.get("/api/v1/queues", READ).await;
    assert_eq!(status, StatusCode::OK);
    let mine = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue"] == json!(queue))
        .cloned();
    assert_eq!(mine.map(|q| q["ready"].clone()), Some(json!(1)));
    let (status, schedules) = api.get("/api/v1/schedules", READ).await;
    assert!(
        status == StatusCode::OK && schedules["schedules"].is_array(),
        "{schedules}"
    );

    api.stop().await;
}

#[tokio::test]
async fn rate_limit_overrides_are_set_listed_and_cleared() {
    let c = client();
    let api = Api::start(c.clone(), true).await;
    let limit = unique("api-limit");
    let declared = c
        .admin()
        .declare_rate_limit(&limit, json!({ "rate": 10, "period": "1s" }))
        .await;
    assert!(declared.is_complete(), "declared everywhere");
    let path = format!("/api/v1/rate-limits/{limit}/override");
    let (status, set) = api
        .call(
            Method::PUT,
            &path,
            Some(ACT),
            Some(json!({ "rate": 1, "period": "1s", "ttl": "10m" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(set["applied"], json!(fleet().shards().count()));
    let (_, limits) = api.get("/api/v1/rate-limits", READ).await;
    let overridden = limits["rate_limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter(|l| l["name"] == json!(limit) && l["override"]["rate"] == json!(1.0))
        .count();
    assert_eq!(overridden, fleet().shards().count(), "{limits}");
    bad(
        api.call(
            Method::PUT,
            &path,
            Some(ACT),
            Some(json!({ "rate": 1, "period": "often", "ttl": "1m" })),
        )
        .await,
        "period",
    );
    let (status, cleared) = api.call(Method::DELETE, &path, Some(ACT), None).await;
    assert_eq!(
        (status, cleared["changed"].clone()),
        (StatusCode::OK, json!(fleet().shards().count()))
    );
    let (status, body) = api.call(Method::DELETE, &path, Some(ACT), None).await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::NOT_FOUND, "no_data_found"),
        "none left to clear"
    );

    api.stop().await;
}

#[tokio::test]
async fn usage_is_bounded() {
    let api = Api::start(client(), true).await;
    let (status, usage) = api.get("/api/v1/usage?group_by=workflow", READ).await;
    assert!(status == StatusCode::OK && usage["groups"].is_object(), "{usage}");
    bad(api.get("/api/v1/usage?group_by=nonsense", READ).await, "group_by");
    bad(api.get("/api/v1/usage?from=yesterday", READ).await, "from");
    bad(
        api.get(
            "/api/v1/usage?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
            READ,
        )
        .await,
        "from",
    );
    // Bounded: fresh reports beyond the minute's budget are refused, the
    // same parameters are answered from the one kept.
    let mut refused = 0;
    for day in 1..=12 {
        let (status, body) = api
            .get(
                &format!("/api/v1/usage?from=2020-01-{day:02}T00:00:00Z&to=2020-01-{day:02}T01:00:00Z"),
                READ,
            )
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(refusal(&body).0, "too_many_requests");
            refused += 1;
        }
    }
    assert!(
        refused >= 2,
        "at most 10 fresh reports a minute: {refused} refused"
    );
    let (status, _) = api
        .get(
            "/api/v1/usage?from=2020-01-01T00:00:00Z&to=2020-01-01T01:00:00Z",
            READ,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "a kept report is served past the budget");
    api.stop().await;
}

#[tokio::test]
async fn fleet_status_and_probes() {
    let api = Api::start(client(), true).await;

    let (status, fleet_view) = api.get("/api/v1/fleet", READ).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fleet_view["shards"], json!(fleet().shards().count()));
    let (status, health) = api.call(Method::GET, "/health", None, None).await;
    assert_eq!((status, health["status"].clone()), (StatusCode::OK, json!("ok")));
    let (status, ready) = api.call(Method::GET, "/ready", None, None).await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    let scrape = reqwest::get(format!("{}/metrics", api.base))
        .await
        .expect("a scrape");
    assert_eq!(scrape.status(), StatusCode::OK);
    let text = scrape.text().await.expect("a body");
    assert!(
        text.contains("sheaf_shard_up"),
        "the served process has /metrics: {text}"
    );
    assert_eq!(ready["ready_shards"], json!(fleet().shards().count()));
    api.stop().await;
}

#[tokio::test]
async fn a_shard_down_is_a_503_that_names_no_shard() {
    // The fleet and one more shard that nothing listens for.
    let spec = format!(
        "{},9=postgres://sheaf@127.0.0.1:1/none",
        sheaf_tests::fleet_spec()
    );
    let topology = sheaf_driver::Topology::parse(&spec).expect("a topology");
    let down = ShardId::new(9).expect("a shard id");
    let client = Arc::new(Client::new(topology, PoolOptions::default()).expect("a client"));
    let api = Api::start(client, true).await;
    let (status, ready) = api.call(Method::GET, "/ready", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert_eq!(ready["ready_shards"], json!(fleet().shards().count()));
    let there = ExecutionId::mint(down).expect("an id");
    let (status, body) = api.get(&format!("/api/v1/executions/{there}"), READ).await;
    assert_eq!(
        (status, refusal(&body).0),
        (StatusCode::SERVICE_UNAVAILABLE, "shard_unavailable")
    );
    assert!(
        !refusal(&body).1.contains("127.0.0.1") && !refusal(&body).1.contains('9'),
        "{body}"
    );
    let (status, page) = api.get("/api/v1/executions?page_size=5", READ).await;
    assert_eq!(status, StatusCode::OK, "the shards that answer still do: {page}");
    assert_eq!(
        (page["partial"].clone(), page["unavailable_shards"].clone()),
        (json!(true), json!(1))
    );
    api.stop().await;
}
