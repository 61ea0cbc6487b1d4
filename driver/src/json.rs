//! [`Json`]: a JSON value carried as its exact text.

use std::error::Error;
use std::fmt;
use std::str::FromStr;

use bytes::{BufMut, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};

/// The version byte of PostgreSQL's binary `jsonb` format.
const JSONB_VERSION: u8 = 1;

/// A JSON value as text, checked to be valid JSON when it was made.
///
/// Build one from a `serde_json::Value` (`json!({...}).into()`), from any
/// `Serialize` type ([`Json::from_serialize`]), or from text ([`Json::parse`],
/// exact to the digit). Read it back as text ([`Json::as_str`]), as a type
/// ([`Json::deserialize`]) or as a `Value` ([`Json::to_value`]).
///
/// Payloads, inputs and results are the caller's data, so every digit and
/// the scale of every number must survive the round trip (`1.50` stays
/// `1.50`, a 30-digit amount stays 30 digits). A `serde_json::Value` keeps
/// that only with serde_json's `arbitrary_precision` feature, which changes
/// serde_json for the whole application (it breaks `#[serde(flatten)]` and
/// untagged enums there). `Json` keeps the text instead: it goes to the
/// shard as written and comes back as the shard printed it.
#[derive(Clone)]
pub struct Json(Box<RawValue>);

impl Json {
    /// JSON `null`.
    pub fn null() -> Json {
        Json::parse("null").expect("null is JSON")
    }

    /// The text as it is, once checked to be one JSON value.
    pub fn parse(text: impl Into<String>) -> Result<Json, serde_json::Error> {
        RawValue::from_string(text.into()).map(Json)
    }

    /// `value` serialized.
    pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> Result<Json, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Json)
    }

    /// The text, exactly as written or as the shard printed it.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The value read as `T`.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.as_str())
    }

    /// The value as a `serde_json::Value`. Without serde_json's
    /// `arbitrary_precision`, a number beyond f64 loses digits here; the
    /// text ([`Json::as_str`]) never does.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.deserialize()
    }

    /// Whether this is JSON `null`.
    pub fn is_null(&self) -> bool {
        self.as_str().trim() == "null"
    }
}

impl PartialEq for Json {
    /// Same text: `1.0` and `1.00` differ, as they do in the shard.
    fn eq(&self, other: &Json) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Json {}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json({})", self.as_str())
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Json {
    type Err = serde_json::Error;

    fn from_str(s: &str) -> Result<Json, serde_json::Error> {
        Json::parse(s)
    }
}

impl From<serde_json::Value> for Json {
    fn from(value: serde_json::Value) -> Json {
        Json::from(&value)
    }
}

impl From<&serde_json::Value> for Json {
    fn from(value: &serde_json::Value) -> Json {
        // A Value always prints as valid JSON.
        Json::parse(value.to_string()).expect("a serde_json::Value is JSON")
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Json)
    }
}

impl ToSql for Json {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.put_u8(JSONB_VERSION);
        }
        out.put_slice(self.as_str().as_bytes());
        Ok(IsNull::No)
    }

    accepts!(JSON, JSONB);
    to_sql_checked!();
}

impl<'a> FromSql<'a> for Json {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Json, Box<dyn Error + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((&JSONB_VERSION, rest)) => rest,
                _ => return Err("unsupported jsonb encoding version".into()),
            }
        } else {
            raw
        };
        Ok(Json::parse(std::str::from_utf8(text)?)?)
    }

    accepts!(JSON, JSONB);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_kept_to_the_digit() {
        let text = r#"{"amount": 12345678901234567890123.000000000001, "rate": 1.50}"#;
        let j = Json::parse(text).unwrap();
        assert_eq!(j.as_str(), text);
        // Serialized into a larger document, the text goes in verbatim.
        let wrapped = serde_json::to_string(&vec![&j]).unwrap();
        assert_eq!(wrapped, format!("[{text}]"));
        let back: Vec<Json> = serde_json::from_str(&wrapped).unwrap();
        assert_eq!(back[0], j);
    }

    #[test]
    fn invalid_text_is_refused() {
        assert!(Json::parse("{").is_err());
        assert!(Json::parse("1 2").is_err());
        assert!(Json::parse("").is_err());
    }

    #[test]
    fn binary_jsonb_round_trips() {
        let j = Json::parse(r#"{"a":1.50}"#).unwrap();
        let mut out = BytesMut::new();
        j.to_sql(&Type::JSONB, &mut out).unwrap();
        assert_eq!(out[0], JSONB_VERSION);
        assert_eq!(Json::from_sql(&Type::JSONB, &out).unwrap(), j);
        assert!(Json::from_sql(&Type::JSONB, b"\x02{}").is_err());
        assert!(Json::from_sql(&Type::JSONB, b"").is_err());
    }

    #[test]
    fn values_and_types_convert() {
        let j: Json = serde_json::json!({"n": 3}).into();
        assert_eq!(j.to_value().unwrap()["n"], 3);
        #[derive(serde::Deserialize)]
        struct N {
            n: u8,
        }
        assert_eq!(j.deserialize::<N>().unwrap().n, 3);
        assert!(Json::null().is_null());
    }
}
