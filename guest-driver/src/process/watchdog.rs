//! A deadline for the vhost-user handshake. vhost's frontend retries a read that timed
//! out, so a socket read timeout never ends a handshake nobody answers (a worker serving
//! another frontend leaves the next connection waiting, unaccepted). The watchdog shuts the
//! socket down when the deadline passes; the waiting read then sees the peer hang up.

use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
enum State {
    Armed,
    Disarmed,
    /// The deadline passed after this long and the socket was shut down.
    Fired(Duration),
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// Shuts a socket down unless disarmed within its timeout.
pub struct Watchdog {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watchdog {
    /// Starts watching `stream` (through a clone of its descriptor).
    pub fn arm(stream: &UnixStream, timeout: Duration) -> std::io::Result<Self> {
        let socket = stream.try_clone()?;
        let shared: Shared = Arc::new((Mutex::new(State::Armed), Condvar::new()));
        let theirs = shared.clone();
        let start = Instant::now();
        let thread = std::thread::Builder::new()
            .name("vgpu-handshake".into())
            .spawn(move || {
                let (m, cv) = &*theirs;
                let guard = m.lock().unwrap_or_else(|e| e.into_inner());
                let (mut state, _) = cv
                    .wait_timeout_while(guard, timeout, |s| *s == State::Armed)
                    .unwrap_or_else(|e| e.into_inner());
                if *state == State::Armed {
                    let _ = socket.shutdown(Shutdown::Both);
                    *state = State::Fired(start.elapsed());
                }
            })?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// How long it waited, if the deadline passed and the socket was shut down.
    pub fn fired(&self) -> Option<Duration> {
        match *lock(&self.shared) {
            State::Fired(d) => Some(d),
            _ => None,
        }
    }

    /// Stops watching; `Some` when the deadline had already passed (the socket is shut
    /// down and the connection unusable).
    pub fn disarm(mut self) -> Option<Duration> {
        self.stop();
        self.fired()
    }

    fn stop(&mut self) {
        {
            let mut s = lock(&self.shared);
            if *s == State::Armed {
                *s = State::Disarmed;
            }
        }
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}
