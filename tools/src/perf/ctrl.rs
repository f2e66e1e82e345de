//! The control connection of `roxe perf`.
//!
//! One TCP connection (the server listens on `-p`, default 18515) carries
//! newline-delimited JSON messages, each an object with a `"type"`:
//!
//! 1. client → server `hello`: the test (op, mode, size, iters, QP count,
//!    depths, MTU) and the client's endpoints (one per QP: lid, qpn, psn,
//!    gid) and its MR (addr, rkey, len). The client's parameters are
//!    authoritative; the server only insists that op and mode match its own.
//! 2. server → client `ready`: the server's endpoints and MR. The server has
//!    brought its QPs to RTS and posted its receives before sending it, so
//!    the client may start at once.
//! 3. client → server `done`, carrying the client's results, once every
//!    operation has completed. A `send` bandwidth server first counts all
//!    its receive completions.
//! 4. server → client `bye`: the final sync; neither side tears its QPs
//!    down before it.
//!
//! Either side sends `error` (with a message) instead when it fails, so the
//! other stops at once instead of running into its timeout.

use super::args::Params;
use super::report::Report;
use super::{ctx, Res};
use roxe_verbs::Endpoint;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a client keeps retrying the TCP connection to the server.
const CONNECT_RETRY: Duration = Duration::from_secs(30);

/// A side's memory region, as the peer's RDMA reaches it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RemoteMr {
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// A control message: one line of JSON, its `"type"` the variant.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    Hello {
        params: Params,
        eps: Vec<Endpoint>,
        mr: RemoteMr,
    },
    Ready {
        eps: Vec<Endpoint>,
        mr: RemoteMr,
        /// The READs outstanding the server connected with (the client's
        /// `outs`, or less where its device allows less).
        #[serde(default)]
        outs: Option<u8>,
    },
    Done {
        report: Report,
    },
    /// `-b`: the client's receives are up; the server may start sending.
    Go,
    Bye,
    Error {
        message: String,
    },
}

/// The TCP control connection: writes go straight out; a reader thread
/// turns incoming lines into messages, so waits can be bounded and CQ loops
/// can notice a peer's error without blocking.
pub struct Ctrl {
    stream: TcpStream,
    rx: mpsc::Receiver<Res<Msg>>,
    /// Messages `check` took while a CQ loop ran.
    stash: RefCell<VecDeque<Msg>>,
}

impl Ctrl {
    pub fn new(stream: TcpStream) -> Res<Ctrl> {
        let _ = stream.set_nodelay(true);
        let read = stream.try_clone().map_err(ctx("control connection"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("roxe-perf-ctrl".into())
            .spawn(move || {
                let mut lines = BufReader::new(read).lines();
                loop {
                    let m = match lines.next() {
                        Some(Ok(l)) if l.trim().is_empty() => continue,
                        Some(Ok(l)) => serde_json::from_str::<Msg>(&l)
                            .map_err(|e| format!("bad control message ({e}): {l}")),
                        Some(Err(e)) => Err(format!("control connection: {e}")),
                        None => Err("the peer closed the control connection".into()),
                    };
                    let last = m.is_err();
                    if tx.send(m).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(ctx("control thread"))?;
        Ok(Ctrl {
            stream,
            rx,
            stash: RefCell::default(),
        })
    }

    pub fn send(&mut self, m: &Msg) -> Res<()> {
        let mut line = serde_json::to_string(m).map_err(ctx("encoding a control message"))?;
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(ctx("control connection"))
    }

    /// The next message, by `deadline`; an `error` from the peer fails.
    pub fn recv(&self, deadline: Instant, waiting_for: &str) -> Res<Msg> {
        if let Some(m) = self.stash.borrow_mut().pop_front() {
            return Ok(m);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(Ok(Msg::Error { message })) => Err(format!("the peer failed: {message}")),
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(format!("timed out waiting for {waiting_for}"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the control connection is gone".into())
            }
        }
    }

    /// Without waiting: fail if the peer reported an error or went away;
    /// keep any other message for `recv`.
    pub fn check(&self) -> Res<()> {
        loop {
            match self.rx.try_recv() {
                Ok(Ok(Msg::Error { message })) => {
                    return Err(format!("the peer failed: {message}"))
                }
                Ok(Ok(m)) => self.stash.borrow_mut().push_back(m),
                Ok(Err(e)) => return Err(e),
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err("the control connection is gone".into())
                }
            }
        }
    }
}

fn server_addrs(addr: &str, port: u16) -> Res<Vec<SocketAddr>> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(vec![sa]);
    }
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let v: Vec<SocketAddr> = if addr.contains(':') {
        addr.to_socket_addrs()
    } else {
        (addr, port).to_socket_addrs()
    }
    .map_err(|e| format!("{addr}: {e}"))?
    .collect();
    if v.is_empty() {
        return Err(format!("{addr}: no address"));
    }
    Ok(v)
}

/// The client's end: the server at `addr` (`-p` its port unless `addr`
/// names one), retried until it answers.
pub fn connect(addr: &str, port: u16, deadline: Instant) -> Res<Ctrl> {
    let targets = server_addrs(addr, port)?;
    let give_up = deadline.min(Instant::now() + CONNECT_RETRY);
    loop {
        let mut last = None;
        for t in &targets {
            match TcpStream::connect_timeout(t, Duration::from_secs(2)) {
                Ok(s) => return Ctrl::new(s),
                Err(e) => last = Some(format!("{t}: {e}")),
            }
        }
        if Instant::now() >= give_up {
            return Err(format!(
                "cannot reach the server ({})",
                last.unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The server's end: the next client on `port`.
pub fn accept(port: u16, deadline: Instant) -> Res<Ctrl> {
    let l =
        TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listening on {port}: {e}"))?;
    l.set_nonblocking(true).map_err(ctx("listener"))?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(ctx("control connection"))?;
                return Ctrl::new(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!("no client connected to port {port} in time"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("accepting on {port}: {e}")),
        }
    }
}
