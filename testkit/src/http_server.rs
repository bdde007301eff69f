//! A real HTTP server on loopback that answers from a script, for testing
//! HTTP agents end to end. One request per connection; each request takes
//! the next reply (the last repeats) and is recorded.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A whole answer with this status, extra headers and body.
    Body {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// A server-sent-events answer; `complete: false` cuts it before `[DONE]`.
    Stream { events: Vec<String>, complete: bool },
    /// Close the connection without answering.
    Hangup,
    /// The reply, after a wait (the server goes on taking requests meanwhile).
    After(std::time::Duration, Box<Reply>),
}

impl Reply {
    /// A chat completion whose assistant message is plain `text`.
    pub fn text(text: &str) -> Self {
        Self::json(200, &serde_json::json!({
            "id": "cmpl", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]
        }).to_string())
    }

    /// A chat completion that calls one tool.
    pub fn tool_call(name: &str, arguments: &str) -> Self {
        Self::json(200, &serde_json::json!({
            "id": "cmpl", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": format!("call_{name}"), "type": "function", "function": {"name": name, "arguments": arguments}}]
            }}]
        }).to_string())
    }

    /// An answer with `status` and a JSON `body`.
    pub fn json(status: u16, body: &str) -> Self {
        Self::Body {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_owned(),
        }
    }

    /// The same answer with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        if let Self::Body { headers, .. } = &mut self {
            headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }

    /// A streamed plain-text answer in `pieces`.
    pub fn streamed_text(pieces: &[&str], complete: bool) -> Self {
        let events = pieces
            .iter()
            .map(|piece| {
                serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}}]})
                    .to_string()
            })
            .collect();
        Self::Stream { events, complete }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// One request as received: its headers (names lowercased) and JSON body.
type Received = (Vec<(String, String)>, Value);

/// A request's method and path (`GET /v1/models`), and the request.
fn read_request(stream: &TcpStream) -> Option<(String, Received)> {
    let request = crate::webhook::read_request(stream)?;
    let body = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    Some((request.target, (request.headers, body)))
}

fn answer(mut stream: TcpStream, reply: &Reply) {
    let _ = match reply {
        Reply::Hangup => return,
        Reply::After(wait, reply) => {
            let (wait, reply) = (*wait, (**reply).clone());
            std::thread::spawn(move || {
                std::thread::sleep(wait);
                answer(stream, &reply);
            });
            return;
        }
        Reply::Body {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
                reason(*status),
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            stream.write_all(format!("{head}\r\n{body}").as_bytes())
        }
        Reply::Stream { events, complete } => {
            let mut out =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                    .to_owned();
            for event in events {
                out.push_str(&format!("data: {event}\n\n"));
            }
            if *complete {
                out.push_str("data: [DONE]\n\n");
            }
            stream.write_all(out.as_bytes())
        }
    };
    let _ = stream.flush();
}

/// A scripted server on `127.0.0.1`, alive until the test process ends.
#[derive(Clone, Debug)]
pub struct ScriptedHttpServer {
    /// The API root to hand to an agent, `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    requests: Arc<Mutex<Vec<Received>>>,
}

impl ScriptedHttpServer {
    /// Starts a server answering with `replies` in order (the last repeats).
    pub fn start(replies: Vec<Reply>) -> Self {
        assert!(
            !replies.is_empty(),
            "a scripted server needs at least one reply"
        );
        Self::start_with(move |n, _| replies[n.min(replies.len() - 1)].clone())
    }

    /// Starts a server that answers request `n` (0-based) with body `body`
    /// with `script(n, body)`: for several agents at once, whose requests
    /// interleave.
    pub fn start_with(script: impl Fn(usize, &Value) -> Reply + Send + 'static) -> Self {
        Self::start_routed(move |n, _, body| script(n, body))
    }

    /// Like [`ScriptedHttpServer::start_with`], the script also seeing the
    /// request's method and path (`GET /v1/models`).
    pub fn start_routed(script: impl Fn(usize, &str, &Value) -> Reply + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                let Some((target, request)) = read_request(&stream) else {
                    continue;
                };
                let reply = script(n, &target, &request.1);
                recorded.lock().unwrap().push(request);
                answer(stream, &reply);
            }
        });
        Self { base_url, requests }
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(_, body)| body.clone()).collect()
    }

    /// The value of header `name` (any case) of every request so far, in
    /// order (`None` where a request lacked it).
    pub fn header_values(&self, name: &str) -> Vec<Option<String>> {
        let name = name.to_ascii_lowercase();
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .map(|(headers, _)| {
                headers
                    .iter()
                    .find(|(header, _)| *header == name)
                    .map(|(_, value)| value.clone())
            })
            .collect()
    }
}
