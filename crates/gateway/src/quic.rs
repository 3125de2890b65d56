//! The built-in QUIC transport: `switchyard-transport-quic`'s server started through
//! [`Transport`], authenticating workers against the gateway's principal table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use switchyard_auth::Authenticate;
use switchyard_transport_quic::{
    CongestionControl, ConnectionConfig, FrameLimits, QuicServer, QuicServerConfig, ServerTls,
};

use crate::config::{CongestionName, QuicSection};
use crate::tls::TlsMaterial;
use crate::transport::{
    ListenAddr, Listening, Protocol, Transport, TransportContext, TransportError,
};

/// How long closed connections get to tell their peers before the transport stops waiting.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The built-in QUIC worker transport.
#[derive(Clone, Debug)]
pub struct QuicTransport {
    section: QuicSection,
}

impl QuicTransport {
    /// A transport serving `section`.
    pub fn new(section: QuicSection) -> Self {
        Self { section }
    }

    pub(crate) fn server_config(&self) -> QuicServerConfig {
        let section = &self.section;
        let keep_alive = section.keep_alive_interval.get();
        QuicServerConfig {
            listen: section.listen,
            connection: ConnectionConfig {
                congestion: match section.congestion {
                    CongestionName::Cubic => CongestionControl::Cubic,
                    CongestionName::Bbr => CongestionControl::Bbr,
                    CongestionName::Newreno => CongestionControl::NewReno,
                },
                keep_alive_interval: (!keep_alive.is_zero()).then_some(keep_alive),
                max_idle_timeout: section.max_idle_timeout.get(),
                initial_rtt: section.initial_rtt.get(),
                stream_receive_window: section.stream_receive_window,
                receive_window: section.receive_window,
                send_window: section.send_window,
                send_fairness: section.send_fairness,
                ack_eliciting_threshold: (section.ack_eliciting_threshold != 0)
                    .then_some(section.ack_eliciting_threshold),
            },
            frames: FrameLimits {
                control: section.max_control_frame,
                lane: section.max_lane_frame,
            },
            migration: section.migration,
            registration_timeout: section.registration_timeout.get(),
            max_unregistered_connections: section.max_unregistered_connections,
            retry: section.retry.to_library(),
            max_unvalidated_handshakes: section.max_unvalidated_handshakes,
            max_connections_per_address: section.max_connections_per_address,
            socket_buffer: section.socket_buffer,
            redundancy: section.redundancy.library(),
            reconnect_grace: section.reconnect_grace.get(),
        }
    }
}

/// The secret the stateless-reset key is derived from: the gateway's TLS private key, which
/// persists across restarts (the development key in the data directory, or the configured
/// one), so a restarted gateway resets the connections of its previous process at once.
fn reset_key_material(tls: &TlsMaterial) -> Result<Vec<u8>, TransportError> {
    let key = tls
        .private_key()
        .map_err(|error| TransportError::Tls(error.to_string()))?;
    Ok(key.secret_der().to_vec())
}

/// The server's rustls configuration: the gateway's certificate, and client certificates
/// verified against the client CA when one is configured but not required, so token-only
/// workers still connect.
fn server_tls(tls: &TlsMaterial) -> Result<ServerTls, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TransportError::Tls(error.to_string()))?;
    let chain = tls
        .cert_chain()
        .map_err(|e| TransportError::Tls(e.to_string()))?;
    let key = tls
        .private_key()
        .map_err(|e| TransportError::Tls(e.to_string()))?;
    let client_cas = tls
        .client_ca_certs()
        .map_err(|e| TransportError::Tls(e.to_string()))?;
    let config = if client_cas.is_empty() {
        builder.with_no_client_auth().with_single_cert(chain, key)
    } else {
        let mut roots = RootCertStore::empty();
        for ca in client_cas {
            roots
                .add(ca)
                .map_err(|error| TransportError::Tls(error.to_string()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = if tls.client_cert_required() {
            verifier
        } else {
            verifier.allow_unauthenticated()
        };
        let verifier = verifier
            .build()
            .map_err(|error| TransportError::Tls(error.to_string()))?;
        builder
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
    }
    .map_err(|error| TransportError::Tls(error.to_string()))?;
    ServerTls::from_rustls(config).map_err(|error| TransportError::Tls(error.to_string()))
}

#[async_trait]
impl Transport for QuicTransport {
    fn name(&self) -> &str {
        "quic"
    }

    async fn start(
        self: Box<Self>,
        context: TransportContext,
    ) -> Result<Listening, TransportError> {
        let config = self.server_config();
        // Its refusal counters at zero from the start (the recorder is installed by now).
        switchyard_transport_quic::register_metrics();
        let server = QuicServer::builder(context.core.clone(), server_tls(&context.tls)?)
            .config(config)
            .stateless_reset_key(&reset_key_material(&context.tls)?)
            // Registrations during a shutdown are refused by core's gate
            // (`AdmissionError::ShuttingDown`, closed `SHUTTING_DOWN`: come back later).
            .authenticator(Arc::clone(&context.principals) as Arc<dyn Authenticate>)
            .bind()
            .await
            .map_err(|error| match error {
                switchyard_transport_quic::ServerError::Bind { addr, source } => {
                    TransportError::Bind { addr, source }
                }
                other => TransportError::other(other),
            })?;
        let addr = server.local_addr();
        let close = context.close.clone();
        let serving = async move {
            // Connections stay open through the drain so workers can finish their tasks.
            close.cancelled().await;
            // Lets the `drain` and the shutdown cancels queued just before reach the workers.
            server.shutdown().await;
            let _ = tokio::time::timeout(CLOSE_GRACE, server.wait_idle()).await;
            Ok(())
        };
        Ok(Listening {
            addrs: vec![ListenAddr {
                protocol: Protocol::Udp,
                addr,
            }],
            serving: Box::pin(serving),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsSection;
    use switchyard_transport_quic::RetryPolicy;

    #[test]
    fn the_retry_keys_reach_the_listener() {
        let config = crate::GatewayConfig::load(
            None,
            [
                ("SWITCHYARD_QUIC_RETRY", "always"),
                ("SWITCHYARD_QUIC_MAX_CONNECTIONS_PER_ADDRESS", "3"),
                ("SWITCHYARD_QUIC_MAX_UNVALIDATED_HANDSHAKES", "4"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            &[],
        )
        .unwrap();
        let server = QuicTransport::new(config.quic).server_config();
        assert_eq!(server.retry, RetryPolicy::Always);
        assert_eq!(server.max_connections_per_address, 3);
        assert_eq!(server.max_unvalidated_handshakes, 4);
        // Control: the default is Retry under load.
        let default = QuicTransport::new(QuicSection::default()).server_config();
        assert_eq!(default.retry, RetryPolicy::UnderLoad);
    }

    #[test]
    fn the_link_keys_reach_the_listener() {
        let config = crate::GatewayConfig::load(
            None,
            [
                ("SWITCHYARD_QUIC_KEEP_ALIVE_INTERVAL", "0s"),
                ("SWITCHYARD_QUIC_INITIAL_RTT", "600ms"),
                ("SWITCHYARD_QUIC_SEND_WINDOW", "123456"),
                ("SWITCHYARD_QUIC_MAX_IDLE_TIMEOUT", "45s"),
                ("SWITCHYARD_QUIC_MIGRATION", "false"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            &[],
        )
        .unwrap();
        let server = QuicTransport::new(config.quic).server_config();
        let link = &server.connection;
        assert_eq!(link.keep_alive_interval, None, "0s sends no keep-alives");
        assert_eq!(link.initial_rtt, std::time::Duration::from_millis(600));
        assert_eq!(link.send_window, 123_456);
        assert_eq!(link.max_idle_timeout, std::time::Duration::from_secs(45));
        assert!(!server.migration);
        // Control: the defaults (keep-alives every 10 s, 333 ms, migration on) differ.
        let default = QuicTransport::new(QuicSection::default()).server_config();
        assert_eq!(
            default.connection.keep_alive_interval,
            Some(std::time::Duration::from_secs(10))
        );
        assert_eq!(
            default.connection.initial_rtt,
            std::time::Duration::from_millis(333)
        );
        assert_ne!(default.connection.send_window, 123_456);
        assert!(default.migration);
    }

    #[test]
    fn the_congestion_key_picks_the_controller() {
        let congestion = |value: &str| {
            let config = crate::GatewayConfig::load(
                None,
                [("SWITCHYARD_QUIC_CONGESTION".to_owned(), value.to_owned())],
                &[],
            )
            .unwrap();
            QuicTransport::new(config.quic)
                .server_config()
                .connection
                .congestion
        };
        assert_eq!(congestion("bbr"), CongestionControl::Bbr);
        assert_eq!(congestion("newreno"), CongestionControl::NewReno);
        assert_eq!(congestion("cubic"), CongestionControl::Cubic);
        // Control: unset, the documented default.
        let default = QuicTransport::new(QuicSection::default()).server_config();
        assert_eq!(default.connection.congestion, CongestionControl::Cubic);
    }

    #[test]
    fn the_fairness_and_ack_threshold_keys_reach_the_listener() {
        let config = crate::GatewayConfig::load(
            None,
            [
                ("SWITCHYARD_QUIC_SEND_FAIRNESS", "false"),
                ("SWITCHYARD_QUIC_ACK_ELICITING_THRESHOLD", "8"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            &[],
        )
        .unwrap();
        let link = QuicTransport::new(config.quic).server_config().connection;
        assert!(!link.send_fairness);
        assert_eq!(link.ack_eliciting_threshold, Some(8));
        // Control: by default lanes are served round-robin and no ACK frequency is asked.
        let default = QuicTransport::new(QuicSection::default())
            .server_config()
            .connection;
        assert!(default.send_fairness);
        assert_eq!(default.ack_eliciting_threshold, None);
    }

    #[test]
    fn the_reset_key_material_survives_a_restart_and_differs_between_data_dirs() {
        let one = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let section = TlsSection::default();
        let first = reset_key_material(&TlsMaterial::load(&section, one.path()).unwrap()).unwrap();
        let restarted =
            reset_key_material(&TlsMaterial::load(&section, one.path()).unwrap()).unwrap();
        let elsewhere =
            reset_key_material(&TlsMaterial::load(&section, other.path()).unwrap()).unwrap();
        assert_eq!(first, restarted, "the same data dir gives the same key");
        assert_ne!(first, elsewhere, "another data dir gives another key");
    }
}
