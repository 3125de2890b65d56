//! A UDP relay between one worker and the gateway that can be frozen: packets stop in both
//! directions while both ends keep their connection state, as on a link that went dark.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

pub(crate) struct Relay {
    addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on loopback and forwards to `gateway`.
    pub(crate) async fn start(gateway: SocketAddr) -> std::io::Result<Self> {
        let front = UdpSocket::bind("127.0.0.1:0").await?;
        let back = UdpSocket::bind("127.0.0.1:0").await?;
        back.connect(gateway).await?;
        let addr = front.local_addr()?;
        let frozen = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(forward(front, back, Arc::clone(&frozen)));
        Ok(Self { addr, frozen, task })
    }

    /// Where the worker should dial.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every packet from now on.
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(front: UdpSocket, back: UdpSocket, frozen: Arc<AtomicBool>) {
    let mut client: Option<SocketAddr> = None;
    let mut up = vec![0u8; 65_536];
    let mut down = vec![0u8; 65_536];
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
