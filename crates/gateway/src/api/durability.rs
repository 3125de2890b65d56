//! Which dispatches are durable when the request does not say: the namespace's `durability`
//! (`namespaces.known[]`), else `dispatch.durability`.

use std::collections::HashMap;

use crate::config::GatewayConfig;

/// The durability defaults of the producer API, read once from configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DurabilityDefaults {
    /// `dispatch.durability`.
    default: bool,
    /// Namespaces with a `durability` of their own.
    namespaces: HashMap<String, bool>,
}

impl DurabilityDefaults {
    /// The defaults `config` sets.
    pub(crate) fn from_config(config: &GatewayConfig) -> Self {
        Self {
            default: config.dispatch.durability.is_durable(),
            namespaces: config
                .namespaces
                .known
                .iter()
                .filter_map(|ns| Some((ns.name.clone(), ns.durability?.is_durable())))
                .collect(),
        }
    }

    /// Whether a dispatch into `namespace` is durable: `requested` when the request says,
    /// else the namespace's default, else the gateway's.
    pub(crate) fn durable(&self, namespace: &str, requested: Option<bool>) -> bool {
        if let Some(requested) = requested {
            return requested;
        }
        if self.namespaces.is_empty() {
            return self.default;
        }
        self.namespaces
            .get(namespace)
            .copied()
            .unwrap_or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DurabilityName, NamespaceSection};

    #[test]
    fn the_request_wins_then_the_namespace_then_the_gateway() {
        let mut config = GatewayConfig::default();
        config.dispatch.durability = DurabilityName::Durable;
        config.namespaces.known = vec![
            NamespaceSection {
                name: "fast".to_owned(),
                durability: Some(DurabilityName::Ephemeral),
                ..NamespaceSection::default()
            },
            NamespaceSection {
                name: "plain".to_owned(),
                ..NamespaceSection::default()
            },
        ];
        let defaults = DurabilityDefaults::from_config(&config);
        assert!(
            !defaults.durable("fast", None),
            "the namespace says ephemeral"
        );
        assert!(
            defaults.durable("plain", None),
            "no word of its own: the gateway's"
        );
        assert!(defaults.durable("unknown", None));
        assert!(defaults.durable("fast", Some(true)), "the request wins");
        assert!(!defaults.durable("plain", Some(false)));
        // Control: with the gateway's default left at ephemeral, nothing unsaid is durable.
        let plain = DurabilityDefaults::from_config(&GatewayConfig::default());
        assert!(!plain.durable("plain", None));
        assert!(plain.durable("plain", Some(true)));
    }
}
