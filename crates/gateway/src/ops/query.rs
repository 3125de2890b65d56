//! [`Query`]: the parameters of an operations request's query string
//! (`application/x-www-form-urlencoded`), bounded in count and length.

use std::collections::BTreeMap;

use axum::http::Uri;

/// Parameters read from one query string; the rest are ignored.
const MAX_PARAMS: usize = 16;

/// The decoded parameters of a query string; the first of a repeated name wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Query(BTreeMap<String, String>);

impl Query {
    /// The parameters of `uri`'s query string (none when it has none).
    pub(crate) fn of(uri: &Uri) -> Self {
        Self::parse(uri.query().unwrap_or(""))
    }

    /// Parses `query`: `name=value` pairs joined by `&`, `+` for a space, `%XX` escapes; a
    /// malformed escape is kept as written.
    pub(crate) fn parse(query: &str) -> Self {
        let mut params = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()).take(MAX_PARAMS) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            params.entry(decode(name)).or_insert_with(|| decode(value));
        }
        Self(params)
    }

    /// The value of `name`, `None` when absent or empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The value of `name` as a number, `None` when absent, empty or not a number.
    pub(crate) fn number(&self, name: &str) -> Option<usize> {
        self.get(name).and_then(|v| v.parse().ok())
    }
}

impl Query {
    /// The same parameters without `offset` and `limit` (every matching row).
    pub(crate) fn without_paging(&self) -> Self {
        let mut params = self.0.clone();
        params.remove("offset");
        params.remove("limit");
        Self(params)
    }

    /// The parameters as a query string [`Query::parse`] reads back.
    pub(crate) fn encode(&self) -> String {
        self.0
            .iter()
            .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                if let Some(byte) = hex {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_plus_signs_are_decoded() {
        let query = Query::parse("namespace=bil%20ling&activity_type=a+b&node=&x=%zz&y=%C3%A9");
        assert_eq!(query.get("namespace"), Some("bil ling"));
        assert_eq!(query.get("activity_type"), Some("a b"));
        assert_eq!(query.get("y"), Some("é"));
        // Control: a malformed escape is kept as written, and an empty value reads as absent.
        assert_eq!(query.get("x"), Some("%zz"));
        assert_eq!(query.get("node"), None);
        assert_eq!(query.get("missing"), None);
    }

    #[test]
    fn numbers_and_the_parameter_bound() {
        let query = Query::parse("offset=50&limit=abc");
        assert_eq!(query.number("offset"), Some(50));
        assert_eq!(query.number("limit"), None);
        let many: Vec<String> = (0..40).map(|i| format!("p{i}=1")).collect();
        let query = Query::parse(&many.join("&"));
        assert_eq!(query.0.len(), MAX_PARAMS);
        // Control: the first repeat of a name wins.
        assert_eq!(Query::parse("a=1&a=2").get("a"), Some("1"));
    }

    #[test]
    fn a_query_passed_to_another_node_keeps_its_filters_but_not_its_page() {
        let query = Query::parse("node=rack+1&offset=5&limit=2&standing=%C3%A9");
        let passed = Query::parse(&query.without_paging().encode());
        assert_eq!(passed.get("node"), Some("rack 1"));
        assert_eq!(passed.get("standing"), Some("é"));
        // Control: paging stays on the asking node, which pages the merged list.
        assert_eq!((passed.get("offset"), passed.get("limit")), (None, None));
        assert_eq!(query.number("offset"), Some(5));
    }
}
