//! A downstream application: it uses its own serde types next to
//! sheaf-driver's, and must not be changed by depending on it.

use serde::{Deserialize, Serialize};
use sheaf_driver::{Client, EnqueueOptions, Json, PoolOptions, Topology};

/// An order with extra fields kept by `flatten`: serde_json's
/// `arbitrary_precision` (which the driver must not switch on) makes its
/// numbers fail to deserialize.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Order {
    pub id: u64,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Extra {
    pub amount: f64,
}

/// An untagged enum with a number, also broken by `arbitrary_precision`.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Amount {
    Cents(u64),
    Text(String),
}

/// A payload built from the application's own type, exactly as sent.
pub fn payload(order: &Order) -> Json {
    Json::from_serialize(order).expect("an order serializes")
}

/// A client over one shard; no connection is opened until a call.
pub fn client(url: &str) -> Client {
    let topology = Topology::builder().shard(0, url).build().expect("a topology");
    Client::new(topology, PoolOptions::default()).expect("a client")
}

/// What an enqueue of an order would carry.
pub fn options(order: &Order) -> EnqueueOptions {
    EnqueueOptions::new().idempotency_key(format!("order-{}", order.id))
}

fn main() {
    let order = Order {
        id: 7,
        extra: Extra { amount: 12.5 },
    };
    println!("{}", payload(&order));
    let _ = (client("postgres://localhost/sheaf"), options(&order));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_and_untagged_still_deserialize() {
        let order: Order = serde_json::from_str(r#"{"id": 7, "amount": 12.5}"#).expect("flatten works");
        assert_eq!(order.extra.amount, 12.5);
        let cents: Amount = serde_json::from_str("1250").expect("untagged works");
        assert_eq!(cents, Amount::Cents(1250));
    }

    #[test]
    fn serde_json_is_as_the_application_chose_it() {
        // With `arbitrary_precision` a Value keeps "1.50"; without it, 1.5.
        let v: serde_json::Value = serde_json::from_str("1.50").unwrap();
        assert_eq!(v.to_string(), "1.5");
    }

    #[test]
    fn payloads_stay_exact_anyway() {
        let text = r#"{"amount": 12345678901234567890123.000000000001, "rate": 1.50}"#;
        let j = Json::parse(text).unwrap();
        assert_eq!(j.as_str(), text);
        assert_eq!(
            payload(&Order {
                id: 1,
                extra: Extra { amount: 2.0 }
            })
            .as_str(),
            r#"{"id":1,"amount":2.0}"#
        );
    }

    #[test]
    fn the_driver_builds_inside_an_application() {
        let c = client("postgres://localhost/sheaf");
        assert!(format!("{c:?}").starts_with("Client"));
        let _ = options(&Order {
            id: 1,
            extra: Extra { amount: 0.0 },
        });
    }
}
