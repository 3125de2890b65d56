//! Step one of the gate: shape checks that need no state.

use std::collections::BTreeSet;

use super::AdmissionError;
use crate::registration::Registration;

/// Longest name (namespace, task queue, activity type, node, identity), in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Most namespaces one registration may serve.
pub const MAX_NAMESPACES: usize = 64;
/// Most activity types one registration may serve.
pub const MAX_ACTIVITY_TYPES: usize = 1024;
/// Most `(namespace, activity type)` pairs one registration may serve: the registry indexes a
/// worker once per pair, so this bounds the work (and the time selection waits) that one
/// registration costs. 64 namespaces x 1,024 types would be 65,536 entries, ~57 ms to admit.
pub const MAX_SERVED_PAIRS: usize = 4096;

/// Checks a registration's shape: non-empty sets, bounded sizes, bounded clean names.
pub(crate) fn validate(registration: &Registration) -> Result<(), AdmissionError> {
    check_set("namespaces", &registration.namespaces, MAX_NAMESPACES)?;
    check_set(
        "activity_types",
        &registration.activity_types,
        MAX_ACTIVITY_TYPES,
    )?;
    let pairs = registration.namespaces.len() * registration.activity_types.len();
    if pairs > MAX_SERVED_PAIRS {
        return Err(AdmissionError::TooMany {
            field: "namespaces x activity_types",
            count: pairs,
            max: MAX_SERVED_PAIRS,
        });
    }
    check_name("task_queue", &registration.task_queue)?;
    if let Some(node) = &registration.node {
        check_name("node", node.as_str())?;
    }
    check_name("identity", &registration.identity)
}

fn check_set(
    field: &'static str,
    set: &BTreeSet<String>,
    max: usize,
) -> Result<(), AdmissionError> {
    if set.is_empty() {
        return Err(AdmissionError::Empty { field });
    }
    if set.len() > max {
        return Err(AdmissionError::TooMany {
            field,
            count: set.len(),
            max,
        });
    }
    if set.iter().any(String::is_empty) {
        return Err(AdmissionError::EmptyEntry { field });
    }
    set.iter().try_for_each(|name| check_name(field, name))
}

fn check_name(field: &'static str, value: &str) -> Result<(), AdmissionError> {
    if value.len() > MAX_NAME_BYTES {
        return Err(AdmissionError::TooLong {
            field,
            len: value.len(),
            max: MAX_NAME_BYTES,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(AdmissionError::ControlCharacter { field });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Node;

    fn valid() -> Registration {
        Registration {
            namespaces: ["ns".to_owned()].into(),
            task_queue: String::new(),
            node: None,
            activity_types: ["echo".to_owned()].into(),
            identity: "w".to_owned(),
            max_concurrency: Some(1),
            reconnect_grace: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn a_valid_registration_passes() {
        assert_eq!(validate(&valid()), Ok(()));
    }

    #[test]
    fn empty_sets_are_refused_by_field() {
        let mut r = valid();
        r.namespaces.clear();
        assert_eq!(
            validate(&r),
            Err(AdmissionError::Empty {
                field: "namespaces"
            })
        );
        let mut r = valid();
        r.activity_types.clear();
        assert_eq!(
            validate(&r),
            Err(AdmissionError::Empty {
                field: "activity_types"
            })
        );
    }

    #[test]
    fn an_empty_entry_is_named_as_an_entry_not_as_an_empty_list() {
        let mut r = valid();
        r.namespaces = [String::new()].into();
        let refused = validate(&r);
        assert_eq!(
            refused,
            Err(AdmissionError::EmptyEntry {
                field: "namespaces"
            })
        );
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err("namespaces holds an empty entry".to_owned())
        );
        let mut r = valid();
        r.activity_types.insert(String::new());
        assert_eq!(
            validate(&r),
            Err(AdmissionError::EmptyEntry {
                field: "activity_types"
            })
        );
        // Control: an empty list is still refused as an empty list.
        let mut r = valid();
        r.namespaces.clear();
        assert_eq!(
            validate(&r).map_err(|e| e.to_string()),
            Err("namespaces is empty".to_owned())
        );
    }

    #[test]
    fn lengths_are_bounded_at_255_bytes() {
        let mut r = valid();
        r.activity_types.insert("a".repeat(MAX_NAME_BYTES));
        assert_eq!(validate(&r), Ok(()), "255 bytes is inside the bound");
        r.activity_types.insert("a".repeat(MAX_NAME_BYTES + 1));
        assert_eq!(
            validate(&r),
            Err(AdmissionError::TooLong {
                field: "activity_types",
                len: 256,
                max: 255
            })
        );
        let mut r = valid();
        r.task_queue = "q".repeat(256);
        assert!(matches!(
            validate(&r),
            Err(AdmissionError::TooLong {
                field: "task_queue",
                ..
            })
        ));
        let mut r = valid();
        r.node = Node::new("n".repeat(256));
        assert!(matches!(
            validate(&r),
            Err(AdmissionError::TooLong { field: "node", .. })
        ));
        let mut r = valid();
        r.identity = "i".repeat(256);
        assert!(matches!(
            validate(&r),
            Err(AdmissionError::TooLong {
                field: "identity",
                ..
            })
        ));
    }

    #[test]
    fn set_sizes_are_bounded() {
        let mut r = valid();
        r.namespaces = (0..MAX_NAMESPACES).map(|i| format!("ns{i}")).collect();
        assert_eq!(validate(&r), Ok(()));
        r.namespaces.insert("one-more".to_owned());
        assert_eq!(
            validate(&r),
            Err(AdmissionError::TooMany {
                field: "namespaces",
                count: 65,
                max: 64
            })
        );
        let mut r = valid();
        r.activity_types = (0..=MAX_ACTIVITY_TYPES).map(|i| format!("a{i}")).collect();
        assert!(matches!(
            validate(&r),
            Err(AdmissionError::TooMany {
                field: "activity_types",
                count: 1025,
                ..
            })
        ));
    }

    #[test]
    fn the_pairs_one_registration_serves_are_bounded() {
        // Fuzzing finding F2: each set within its own limit, but 64 x 1,024 pairs.
        let mut r = valid();
        r.namespaces = (0..MAX_NAMESPACES).map(|i| format!("ns{i}")).collect();
        r.activity_types = (0..MAX_ACTIVITY_TYPES).map(|i| format!("a{i}")).collect();
        assert_eq!(
            validate(&r),
            Err(AdmissionError::TooMany {
                field: "namespaces x activity_types",
                count: 65_536,
                max: MAX_SERVED_PAIRS
            })
        );
        // Control: exactly at the limit is admitted, in either shape.
        r.namespaces = (0..4).map(|i| format!("ns{i}")).collect();
        assert_eq!(validate(&r), Ok(()));
        r.namespaces = (0..MAX_NAMESPACES).map(|i| format!("ns{i}")).collect();
        r.activity_types = (0..MAX_SERVED_PAIRS / MAX_NAMESPACES)
            .map(|i| format!("a{i}"))
            .collect();
        assert_eq!(validate(&r), Ok(()));
        r.activity_types.insert("one-more".to_owned());
        assert!(matches!(validate(&r), Err(AdmissionError::TooMany { .. })));
    }

    #[test]
    fn control_characters_are_refused() {
        let mut r = valid();
        r.namespaces.insert("bad\nname".to_owned());
        assert_eq!(
            validate(&r),
            Err(AdmissionError::ControlCharacter {
                field: "namespaces"
            })
        );
    }
}
