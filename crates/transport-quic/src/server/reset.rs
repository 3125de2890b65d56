//! What lets a restarted gateway reset the connections of its previous process at once.
//!
//! A QUIC server that lost a connection's state answers the peer's next packet with a
//! stateless reset, recognised by a token the server promised when it issued the connection
//! id. Quinn derives the token from the endpoint's reset key, random per process by default,
//! and its default id generator signs ids with another per-process key and drops packets whose
//! id it cannot verify. After a restart the worker would hear nothing until its idle timeout.
//! Here the reset key is derived from material that outlives the process, and the ids carry no
//! per-process signature, so the new process answers every stray packet with the reset the
//! worker expects.

use quinn::{ConnectionId, ConnectionIdGenerator};
use rand::Rng;
use ring::hmac;

/// Domain label of the derivation, so the key shares nothing usable with the material.
const RESET_KEY_LABEL: &[u8] = b"switchyard quic stateless reset key v1";

/// Bytes of a connection id (quinn's default length).
const CID_LEN: usize = 8;

/// The stateless-reset key derived from `material`: HMAC-SHA256 keyed by a fixed label.
pub(crate) fn reset_key(material: &[u8]) -> hmac::Key {
    let label = hmac::Key::new(hmac::HMAC_SHA256, RESET_KEY_LABEL);
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&label, material).as_ref())
}

/// Random connection ids that every process accepts as possibly its own, so a packet for a
/// connection of a previous process reaches the stateless reset instead of being dropped.
/// (Quinn rate-limits resets, so stray packets cannot turn the endpoint into an amplifier.)
pub(crate) struct RandomCids;

impl ConnectionIdGenerator for RandomCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut id = [0; CID_LEN];
        rand::rng().fill(&mut id);
        ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(key: &hmac::Key) -> Vec<u8> {
        hmac::sign(key, b"connection id").as_ref().to_vec()
    }

    #[test]
    fn the_reset_key_is_the_same_for_the_same_material_and_differs_otherwise() {
        let first = token(&reset_key(b"material of one gateway"));
        let again = token(&reset_key(b"material of one gateway"));
        let other = token(&reset_key(b"material of another gateway"));
        assert_eq!(
            first, again,
            "a restart with the same material keeps the tokens"
        );
        assert_ne!(first, other);
        // Control: the label is applied, so the material itself is never the key.
        let raw = hmac::Key::new(hmac::HMAC_SHA256, b"material of one gateway");
        assert_ne!(first, token(&raw));
    }

    #[test]
    fn connection_ids_are_random_and_of_the_default_length() {
        let mut cids = RandomCids;
        let (a, b) = (cids.generate_cid(), cids.generate_cid());
        assert_eq!(a.len(), CID_LEN);
        assert_ne!(a, b);
    }
}
