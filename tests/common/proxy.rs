//! A TCP proxy on loopback in front of one server, which stalls, cuts and loses replies on cue.

#![allow(unused_imports)]

use super::*;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

/// A TCP proxy on loopback in front of one server: it forwards both ways until
/// [`stall`](Self::stall) is called, then accepts and reads but never answers (what it holds is
/// delivered if [`resume`](Self::resume) is called, and lost on a [`cut`](Self::cut)). A node
/// that hangs without closing its connections, which a client notices only by timing out.
///
/// It can also [`cut`](Self::cut): close every connection and refuse new ones (accepted and
/// closed at once) until [`heal`](Self::heal), as a network that drops the server would.
pub struct StallingProxy {
    port: u16,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// What happens to the next reply: [`KEEP`], [`LOSE`] or [`CLOSE_AFTER`].
    lose_reply: std::sync::Arc<std::sync::atomic::AtomicU8>,
    /// Added to every chunk either way, in ms.
    latency: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The reply to the next request holding these bytes is lost ([`lose_reply_to`]).
    ///
    /// [`lose_reply_to`]: Self::lose_reply_to
    lose_to: std::sync::Arc<std::sync::Mutex<Option<Target>>>,
    /// Each connection's own loss flag and the requests it has sent so far
    /// ([`lose_next_reply_on`](Self::lose_next_reply_on)).
    connections: Connections,
}

/// Each connection's own loss flag, with every request byte it has sent.
type Connections = std::sync::Arc<
    std::sync::Mutex<
        Vec<(
            std::sync::Arc<std::sync::atomic::AtomicU8>,
            std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
        )>,
    >,
>;

/// The request whose reply is lost: the bytes it holds, and whether it was sent (its
/// connection's reply side then loses the next reply and clears this).
struct Target {
    needle: Vec<u8>,
    sent: bool,
}

impl StallingProxy {
    /// Starts forwarding a free loopback port to `target_port` on loopback.
    pub fn start(target_port: u16) -> StallingProxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener =
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind the proxy");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("proxy address").port();
        let stalled = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let lose_reply = Arc::new(std::sync::atomic::AtomicU8::new(KEEP));
        let latency = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let lose_to: Arc<std::sync::Mutex<Option<Target>>> = Arc::default();
        let targeted = lose_to.clone();
        let connections: Connections = Arc::default();
        let registry = connections.clone();
        let (flags, cutting, done) = (stalled.clone(), cut.clone(), stop.clone());
        let losing = lose_reply.clone();
        let delay = latency.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) if cutting.load(std::sync::atomic::Ordering::SeqCst) => {
                        drop(client);
                    }
                    Ok((client, _)) => {
                        let Ok(server) =
                            TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, target_port))
                        else {
                            continue;
                        };
                        let _ = client.set_nonblocking(false);
                        // This connection's own: its next reply is lost (armed by a request
                        // holding `lose_to`'s bytes).
                        let own = Arc::new(std::sync::atomic::AtomicU8::new(KEEP));
                        let sent: Arc<std::sync::Mutex<Vec<u8>>> = Arc::default();
                        registry
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((own.clone(), sent.clone()));
                        for (from, to, replies, watch) in [
                            (
                                client.try_clone(),
                                server.try_clone(),
                                None,
                                Some(targeted.clone()),
                            ),
                            (
                                server.try_clone(),
                                client.try_clone(),
                                Some(losing.clone()),
                                Some(targeted.clone()),
                            ),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let (flags, cutting, done, delay, own) = (
                                    flags.clone(),
                                    cutting.clone(),
                                    done.clone(),
                                    delay.clone(),
                                    own.clone(),
                                );
                                // The request side records what it sends.
                                let history = replies.is_none().then(|| sent.clone());
                                std::thread::spawn(move || {
                                    let faults = Faults {
                                        stalled: &flags,
                                        cut: &cutting,
                                        stop: &done,
                                        lose_reply: replies.as_deref(),
                                        latency: &delay,
                                        lose_to: watch.as_deref(),
                                        own: &own,
                                        sent: history.as_deref(),
                                    };
                                    pump(from, to, faults)
                                });
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StallingProxy {
            port,
            stalled,
            cut,
            lose_reply,
            latency,
            stop,
            lose_to,
            connections,
        }
    }

    /// The `redis://` URL clients should use.
    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on, nothing is forwarded either way; connections stay open.
    pub fn stall(&self) {
        self.stalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Forwards again, including what was held.
    pub fn resume(&self) {
        self.stalled
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection now and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Accepts and forwards new connections again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next reply the server sends is thrown away and its connection closed: the request
    /// ran, its client never learns how. Requests sent meanwhile are forwarded as usual.
    pub fn lose_next_reply(&self) {
        self.lose_reply
            .store(LOSE, std::sync::atomic::Ordering::SeqCst);
    }

    /// The reply to the next request that holds `needle` is thrown away and its connection
    /// closed, whichever connection sends it: as [`lose_next_reply`](Self::lose_next_reply),
    /// but never another connection's reply (a subscriber's, a background call's) that happens
    /// to come first.
    pub fn lose_reply_to(&self, needle: &[u8]) {
        *self
            .lose_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Target {
            needle: needle.to_vec(),
            sent: false,
        });
    }

    /// The next reply on the connection whose requests so far hold every one of `needles` is
    /// thrown away and that connection closed: for a request already on its way (so that
    /// [`lose_reply_to`](Self::lose_reply_to) is too late), never another connection's reply.
    /// False when no connection sent them all.
    pub fn lose_next_reply_on(&self, needles: &[&[u8]]) -> bool {
        let connections = self
            .connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (own, sent) in connections.iter() {
            let sent = sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let holds = |needle: &&[u8]| sent.windows(needle.len()).any(|w| w == *needle);
            if needles.iter().all(holds) {
                own.store(LOSE, std::sync::atomic::Ordering::SeqCst);
                return true;
            }
        }
        false
    }

    /// The next reply the server sends is delivered, then its connection is closed: the client
    /// has its answer, and its next command on that connection needs a new one.
    pub fn close_after_next_reply(&self) {
        self.lose_reply
            .store(CLOSE_AFTER, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds every chunk, either way, `latency` before forwarding it (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        self.latency.store(
            latency.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Whether a reply armed by [`lose_next_reply`](Self::lose_next_reply) is still to come.
    pub fn reply_pending_loss(&self) -> bool {
        self.lose_reply.load(std::sync::atomic::Ordering::SeqCst) != KEEP
            || self
                .connections
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|(own, _)| own.load(std::sync::atomic::Ordering::SeqCst) != KEEP)
            || self
                .lose_to
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some()
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The next reply is forwarded as usual.
const KEEP: u8 = 0;
/// The next reply is thrown away and its connection closed.
const LOSE: u8 = 1;
/// The next reply is forwarded, then its connection closed.
const CLOSE_AFTER: u8 = 2;

/// What a proxy's pump applies to the bytes it copies.
struct Faults<'a> {
    stalled: &'a std::sync::atomic::AtomicBool,
    cut: &'a std::sync::atomic::AtomicBool,
    stop: &'a std::sync::atomic::AtomicBool,
    /// On the reply side only: what happens to the next chunk ([`LOSE`], [`CLOSE_AFTER`]).
    lose_reply: Option<&'a std::sync::atomic::AtomicU8>,
    latency: &'a std::sync::atomic::AtomicU64,
    /// The request whose reply is lost ([`StallingProxy::lose_reply_to`]).
    lose_to: Option<&'a std::sync::Mutex<Option<Target>>>,
    /// The connection's own loss, armed by its request side, taken by its reply side.
    own: &'a std::sync::atomic::AtomicU8,
    /// On the request side: every byte sent so far.
    sent: Option<&'a std::sync::Mutex<Vec<u8>>>,
}

/// Copies `from` to `to`, holding each chunk while stalled and for the latency, until either
/// side closes, the proxy is cut, or stopped; on the reply side a lost reply closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, faults: Faults<'_>) {
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buffer = [0u8; 16 * 1024];
    while !faults.stop.load(Ordering::Relaxed) && !faults.cut.load(Ordering::SeqCst) {
        let read = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        let latency = faults.latency.load(Ordering::SeqCst);
        if latency > 0 {
            std::thread::sleep(Duration::from_millis(latency));
        }
        while faults.stalled.load(Ordering::SeqCst) && !faults.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // A cut drops what a stall held, as a network that went down loses what was in flight.
        if faults.cut.load(Ordering::SeqCst) || faults.stop.load(Ordering::Relaxed) {
            break;
        }
        let mut fault = faults
            .lose_reply
            .map_or(KEEP, |fault| fault.swap(KEEP, Ordering::SeqCst));
        if let Some(lose_to) = faults.lose_to {
            let mut target = lose_to
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if faults.lose_reply.is_none() {
                // The request side: armed before the request is forwarded, so before its
                // reply can come.
                if let Some(target) = target.as_mut().filter(|target| !target.sent) {
                    let needle = &target.needle;
                    if buffer[..read]
                        .windows(needle.len())
                        .any(|window| window == needle)
                    {
                        faults.own.store(LOSE, Ordering::SeqCst);
                        target.sent = true;
                    }
                }
            } else if fault == KEEP && faults.own.swap(KEEP, Ordering::SeqCst) == LOSE {
                fault = LOSE;
                *target = None;
            }
        }
        if let Some(sent) = faults.sent {
            sent.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(&buffer[..read]);
        }
        if fault == LOSE {
            break;
        }
        if to.write_all(&buffer[..read]).is_err() || fault == CLOSE_AFTER {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}
