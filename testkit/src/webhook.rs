//! A webhook receiver on loopback: it records every request whole (the
//! raw body, for checking a signature) with when it came, and answers
//! each with the status its script gives. It can start on a port chosen
//! before (a receiver that was down comes back where it was).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Hook {
    pub at: Instant,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status it was answered with.
    pub status: u16,
}

impl Hook {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A receiver, alive until the test process ends.
#[derive(Clone, Debug)]
pub struct WebhookReceiver {
    pub url: String,
    hooks: Arc<Mutex<Vec<Hook>>>,
}

/// A loopback address no one listens on (a receiver that is down).
pub fn unused_loopback_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address")
}

impl WebhookReceiver {
    /// Starts on a fresh port, answering request `n` (0-based) with
    /// `status(n)`.
    pub fn start(status: impl Fn(usize) -> u16 + Send + 'static) -> Self {
        Self::start_at(unused_loopback_address(), status)
    }

    /// Starts on `address`.
    pub fn start_at(address: SocketAddr, status: impl Fn(usize) -> u16 + Send + 'static) -> Self {
        let listener = TcpListener::bind(address).expect("bind the receiver's address");
        let url = format!("http://{address}/hook");
        let hooks: Arc<Mutex<Vec<Hook>>> = Arc::default();
        let recorded = hooks.clone();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                let Some(Request { headers, body, .. }) = read_request(&stream) else {
                    continue;
                };
                let status = status(n);
                recorded.lock().unwrap().push(Hook {
                    at: Instant::now(),
                    headers,
                    body,
                    status,
                });
                let mut stream = stream;
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 {status} Status\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                );
            }
        });
        Self { url, hooks }
    }

    /// Every request so far, in order.
    pub fn hooks(&self) -> Vec<Hook> {
        self.hooks.lock().unwrap().clone()
    }

    /// The requests answered with a 2xx, in order.
    pub fn accepted(&self) -> Vec<Hook> {
        self.hooks()
            .into_iter()
            .filter(|hook| (200..300).contains(&hook.status))
            .collect()
    }
}

/// One HTTP request as read: its method and path (`POST /hook`), its
/// headers (names lowercased) and its body.
pub(crate) struct Request {
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// Reads one request (its body by `Content-Length`); none when the client
/// went away or sent no request.
pub(crate) fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let target = line
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        target,
        headers,
        body,
    })
}
