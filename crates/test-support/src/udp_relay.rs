//! A UDP relay on loopback between one worker and the gateway that can freeze: datagrams stop
//! in both directions while both ends keep their connection state, as on a link gone dark.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// Forwards the datagrams of the one client that sends to [`UdpRelay::addr`] on to the
/// upstream address and back.
#[derive(Debug)]
pub struct UdpRelay {
    addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl UdpRelay {
    /// Listens on loopback and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let front = UdpSocket::bind("127.0.0.1:0").await?;
        let back = UdpSocket::bind("127.0.0.1:0").await?;
        back.connect(upstream).await?;
        let addr = front.local_addr()?;
        let frozen = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(forward(front, back, Arc::clone(&frozen)));
        Ok(Self { addr, frozen, task })
    }

    /// Where the worker dials.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every datagram from now on.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Forwards datagrams again after [`UdpRelay::freeze`]: the end of a blackout.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }

    /// Drops every datagram for `duration`, then forwards again: a blackout that ends by
    /// itself (the emulated outage, on the runtime's clock). Needs a tokio runtime.
    pub fn blackout(&self, duration: std::time::Duration) {
        self.freeze();
        let frozen = Arc::clone(&self.frozen);
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            frozen.store(false, Ordering::SeqCst);
        });
    }
}

impl Drop for UdpRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(front: UdpSocket, back: UdpSocket, frozen: Arc<AtomicBool>) {
    let mut client: Option<SocketAddr> = None;
    let (mut up, mut down) = (vec![0_u8; 65_536], vec![0_u8; 65_536]);
    loop {
        tokio::select! {
            received = front.recv_from(&mut up) => {
                let Ok((len, from)) = received else { return };
                client = Some(from);
                if !frozen.load(Ordering::SeqCst) {
                    let _ = back.send(&up[..len]).await;
                }
            }
            received = back.recv(&mut down) => {
                let Ok(len) = received else { return };
                if let (Some(client), false) = (client, frozen.load(Ordering::SeqCst)) {
                    let _ = front.send_to(&down[..len], client).await;
                }
            }
        }
    }
}
