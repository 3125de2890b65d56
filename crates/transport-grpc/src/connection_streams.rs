//! The per-connection stream cap: one HTTP/2 connection carries at most
//! [`GrpcServerConfig::max_workers_per_connection`](crate::GrpcServerConfig) worker streams.
//!
//! A connection is known by its peer address, which is unique among the connections open at
//! once; a stream whose server gives no peer address (a custom incoming without connect info)
//! is not counted. The count covers open streams, registered or not, and falls when a
//! stream's task ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::status::SessionError;

/// Worker streams open per peer address.
#[derive(Debug)]
pub(crate) struct ConnectionStreams {
    max: usize,
    open: Mutex<HashMap<SocketAddr, usize>>,
}

/// One counted stream; dropping it frees its place.
#[derive(Debug)]
pub(crate) struct StreamPlace {
    streams: Arc<ConnectionStreams>,
    peer: SocketAddr,
}

impl ConnectionStreams {
    /// A cap of `max` streams per connection.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SocketAddr, usize>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more stream from `peer`, or the refusal naming the cap.
    pub(crate) fn open(
        self: &Arc<Self>,
        peer: Option<SocketAddr>,
    ) -> Result<Option<StreamPlace>, SessionError> {
        let Some(peer) = peer else {
            return Ok(None);
        };
        let mut open = self.lock();
        let count = open.entry(peer).or_insert(0);
        if *count >= self.max {
            return Err(SessionError::ConnectionWorkerLimit { limit: self.max });
        }
        *count += 1;
        Ok(Some(StreamPlace {
            streams: Arc::clone(self),
            peer,
        }))
    }
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut open = self.streams.lock();
        if let Some(count) = open.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holds_at_most_max_streams_and_a_closed_one_frees_its_place() {
        let streams = ConnectionStreams::new(2);
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        let first = streams.open(Some(a)).unwrap();
        let _second = streams.open(Some(a)).unwrap();
        let refused = streams.open(Some(a)).unwrap_err();
        assert_eq!(refused, SessionError::ConnectionWorkerLimit { limit: 2 });
        assert_eq!(refused.status().code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .to_string()
                .contains("`grpc.max_workers_per_connection` (2)")
        );
        // Controls: another connection is not counted, and a closed stream frees a place.
        assert!(streams.open(Some(b)).unwrap().is_some());
        drop(first);
        assert!(streams.open(Some(a)).unwrap().is_some());
        assert!(
            streams.open(None).unwrap().is_none(),
            "no peer: not counted"
        );
    }
}
