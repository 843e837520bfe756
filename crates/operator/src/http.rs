//! A tiny HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`.
//!
//! ```text
//!   [TcpListener] --accept--> one task per connection:
//!       read head (≤ 8 KiB, 5s) -> route -> write response (10s) -> close
//! ```
//!
//! No web framework: one request per connection, `Connection: close`, GET and HEAD only, no
//! request bodies. Bad input gets a 4xx and the connection is closed; nothing a client sends
//! can panic the server or stop it accepting others.
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::metrics::Metrics;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Largest request head (request line and headers) accepted.
const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take the response.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a closing connection waits for the client to finish sending.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Input discarded at most while closing.
const MAX_DRAIN: usize = 64 * 1024;
/// Connections served at once; further ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;

/// Serves `/metrics` (OpenMetrics text), `/healthz` (always 200 `ok`) and `/readyz` (200 while
/// `ready` is set, else 503) on `addr` until the process ends. Fails only if `addr` cannot be
/// bound.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    serve_listener(listener, metrics, ready).await
}

async fn serve_listener(
    listener: TcpListener,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = slots.clone().acquire_owned().await?;
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (metrics, ready) = (metrics.clone(), ready.clone());
        tokio::spawn(async move {
            if let Err(error) = handle(stream, &metrics, &ready).await {
                tracing::debug!(%error, "http connection");
            }
            drop(permit);
        });
    }
}

/// A response to write.
#[derive(Debug, PartialEq)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
    /// Extra header lines, each ending in CRLF.
    extra: &'static str,
}

const TEXT: &str = "text/plain; charset=utf-8";

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: format!("{body}\n"),
            extra: "",
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// How reading the request head ended.
enum Head {
    Complete(Vec<u8>),
    /// The client closed the connection without sending anything.
    Empty,
    Truncated,
    TooLarge,
}

async fn handle(stream: TcpStream, metrics: &Metrics, ready: &AtomicBool) -> io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&stream)).await {
        Ok(head) => head?,
        Err(_) => {
            let r = Response::text(408, "request timeout");
            return finish(stream, &r, false).await;
        }
    };
    let (response, head_only) = match head {
        Head::Empty => return Ok(()),
        Head::Truncated => (Response::text(400, "bad request"), false),
        Head::TooLarge => (Response::text(431, "request head too large"), false),
        Head::Complete(bytes) => match parse_request_line(&bytes) {
            Some((method, path)) => (
                route(method, path, metrics, ready),
                method.eq_ignore_ascii_case("HEAD"),
            ),
            None => (Response::text(400, "bad request"), false),
        },
    };
    finish(stream, &response, head_only).await
}

/// Writes the response within the write timeout and closes the connection.
async fn finish(mut stream: TcpStream, r: &Response, head_only: bool) -> io::Result<()> {
    let bytes = render(r, head_only);
    let result = tokio::time::timeout(WRITE_TIMEOUT, async {
        write_all(&stream, &bytes).await?;
        poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await
    })
    .await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "write timeout")),
    }
    // Closing with unread input would reset the connection and could destroy the response
    // before the client reads it: drain what is left for a moment.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain(&stream)).await;
    Ok(())
}

/// Reads and discards input until end of stream or [`MAX_DRAIN`] bytes.
async fn drain(stream: &TcpStream) -> io::Result<()> {
    let mut chunk = [0u8; 1024];
    let mut total = 0;
    while total < MAX_DRAIN {
        stream.readable().await?;
        match stream.try_read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn render(r: &Response, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len(),
        r.extra,
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(r.body.as_bytes());
    }
    out
}

async fn read_head(stream: &TcpStream) -> io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head_end(&buf) {
            buf.truncate(end);
            return Ok(Head::Complete(buf));
        }
        if buf.len() >= MAX_HEAD {
            return Ok(Head::TooLarge);
        }
        stream.readable().await?;
        let n = match stream.try_read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(if buf.is_empty() {
                Head::Empty
            } else {
                Head::Truncated
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The end of the request head: before the first empty line (CRLF or bare LF).
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = buf.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn write_all(stream: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        stream.writable().await?;
        match stream.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Method and path (without query) from `METHOD SP TARGET SP HTTP/1.x`.
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_alphabetic())
        || !target.starts_with('/')
        || !version.starts_with("HTTP/1.")
    {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some((method, path))
}

fn route(method: &str, path: &str, metrics: &Metrics, ready: &AtomicBool) -> Response {
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return Response::text(404, "not found");
    }
    if !(method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD")) {
        return Response {
            extra: "Allow: GET, HEAD\r\n",
            ..Response::text(405, "method not allowed")
        };
    }
    match path {
        "/metrics" => Response {
            status: 200,
            content_type: OPENMETRICS_CONTENT_TYPE,
            body: metrics.encode(),
            extra: "",
        },
        "/healthz" => Response::text(200, "ok"),
        _ if ready.load(Ordering::SeqCst) => Response::text(200, "ok"),
        _ => Response::text(503, "not ready"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    async fn start() -> (SocketAddr, Arc<AtomicBool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ready = Arc::new(AtomicBool::new(false));
        let metrics = Metrics::new();
        metrics.set_window("nightly", true);
        tokio::spawn(serve_listener(listener, metrics, ready.clone()));
        (addr, ready)
    }

    /// Sends raw bytes, half-closes, returns the whole response.
    async fn raw(addr: SocketAddr, request: &'static [u8]) -> String {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(request).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            String::from_utf8_lossy(&out).into_owned()
        })
        .await
        .unwrap()
    }

    fn status(response: &str) -> &str {
        response.split(' ').nth(1).unwrap_or("")
    }

    #[tokio::test]
    async fn paths_and_status_codes() {
        let (addr, ready) = start().await;

        let r = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status(&r), "200", "{r}");
        assert!(r.contains(&format!("Content-Type: {OPENMETRICS_CONTENT_TYPE}\r\n")));
        assert!(r.contains("Connection: close\r\n"));
        assert!(
            r.contains("gpu_defrag_window_open{policy=\"nightly\"} 1"),
            "{r}"
        );
        assert!(r.ends_with("# EOF\n"));

        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        assert!(r.ends_with("\r\n\r\nok\n"), "{r}");

        let r = raw(addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "503");
        ready.store(true, Ordering::SeqCst);
        let r = raw(addr, b"GET /readyz?verbose HTTP/1.0\r\n\r\n").await;
        assert_eq!(status(&r), "200");

        let r = raw(addr, b"GET /nope HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "404");
        let r = raw(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(status(&r), "405");
        assert!(r.contains("Allow: GET, HEAD\r\n"));

        let r = raw(addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        assert!(
            r.contains("Content-Length: 3\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
    }

    #[tokio::test]
    async fn garbage_gets_400_and_the_server_lives_on() {
        let (addr, _) = start().await;
        for garbage in [
            &b"\x00\x01\xffgarbage\r\n\r\n"[..],
            b"garbage without end",
            b"GET\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        ] {
            let r = tokio::task::spawn_blocking(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(garbage).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                let mut out = Vec::new();
                s.read_to_end(&mut out).unwrap();
                String::from_utf8_lossy(&out).into_owned()
            })
            .await
            .unwrap();
            assert_eq!(status(&r), "400", "{garbage:?}: {r}");
        }
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
    }

    #[tokio::test]
    async fn oversized_head_gets_431() {
        let (addr, _) = start().await;
        static BIG: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
            let mut v = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
            v.resize(MAX_HEAD + 100, b'a');
            v
        });
        let r = raw(addr, BIG.as_slice()).await;
        assert_eq!(status(&r), "431", "{r}");
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
    }

    #[tokio::test]
    async fn silent_client_does_not_block_others() {
        let (addr, _) = start().await;
        let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        drop(idle);
    }

    #[test]
    fn request_line_parsing() {
        assert_eq!(
            parse_request_line(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(parse_request_line(b"GET / HTTP/1.0"), Some(("GET", "/")));
        assert_eq!(parse_request_line(b""), None);
        assert_eq!(parse_request_line(b"G-T / HTTP/1.1"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
