//! Field encodings JSON lacks: 64-bit ids as decimal strings, opaque bytes as base64.

/// A `u64` written as a decimal string; read from a string or a JSON number.
pub(super) mod decimal {
    use std::fmt;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        deserializer.deserialize_any(Decimal)
    }

    struct Decimal;

    impl Visitor<'_> for Decimal {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an unsigned 64-bit integer as a decimal string")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
            Ok(value)
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<u64, E> {
            value
                .parse()
                .map_err(|_| E::invalid_value(de::Unexpected::Str(value), &self))
        }
    }
}

/// Opaque bytes written as standard base64 with padding.
pub(super) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer, de};

    pub(crate) fn serialize<S: Serializer>(
        value: &Bytes,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(value))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Bytes, D::Error> {
        decode(&String::deserialize(deserializer)?)
    }

    pub(super) fn decode<E: de::Error>(text: &str) -> Result<Bytes, E> {
        STANDARD
            .decode(text.as_bytes())
            .map(Bytes::from)
            .map_err(|error| E::custom(format_args!("invalid base64: {error}")))
    }
}

/// Like [`base64_bytes`], for a field that may be absent or `null`.
pub(super) mod base64_option {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<Bytes>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => super::base64_bytes::serialize(bytes, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Bytes>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| super::base64_bytes::decode(&text))
            .transpose()
    }
}
