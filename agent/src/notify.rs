//! The systemd notify protocol (`sd_notify(3)`), in a few lines over a Unix
//! datagram socket: `READY=1` once the agent serves, `WATCHDOG=1` every half
//! of `WATCHDOG_USEC`, `STOPPING=1` on the way out. Without `NOTIFY_SOCKET`
//! (not under systemd) every call does nothing.
//!
//! The pings come from their own task on the multi-threaded runtime, so a
//! long drain or a deploy (which only await) never starves them; a runtime
//! that stops making progress stops them, and systemd restarts the agent.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where notifications go, when the agent runs under a notify-aware supervisor.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// From `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
    pub fn from_env() -> Option<Notifier> {
        let target = std::env::var_os("NOTIFY_SOCKET")?;
        let target = target.to_str()?;
        let addr = match target.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes()).ok()?
            }
            None => SocketAddr::from_pathname(target).ok()?,
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, addr })
    }

    /// Sends one notification (best effort).
    pub fn send(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.addr) {
            crate::log::warn("notify_failed", serde_json::json!({"error": e.to_string()}));
        }
    }
}

/// Half of `WATCHDOG_USEC`, when the watchdog is on for this process
/// (`WATCHDOG_PID`, if set, must be ours).
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        if pid.to_str()?.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Pings `WATCHDOG=1` every `every` until the task is dropped.
pub async fn watchdog(notifier: std::sync::Arc<Notifier>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        notifier.send("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_listening_socket() {
        let dir = crate::files::test_dir("notify");
        let path = dir.join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: UnixDatagram::unbound().unwrap(),
            addr: SocketAddr::from_pathname(&path).unwrap(),
        };
        n.send("READY=1");
        let mut buf = [0u8; 64];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
    }
}
