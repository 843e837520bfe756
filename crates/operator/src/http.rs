//! The HTTP/1.1 server of `/metrics`, `/healthz` and `/readyz` (hyper).
//!
//! ```text
//!   [TcpListener] --accept (at most 64 at once)--> one task per connection:
//!       hyper: read head (≤ 8 KiB, 5s) -> route -> write response (10s) -> close
//!       -> discard what the client still sends (≤ 64 KiB, 1s)
//! ```
//!
//! One request per connection, `Connection: close`, GET and HEAD only, request bodies
//! ignored. A request hyper cannot parse gets its 400 or 431 (without a body); a head not
//! complete within 5 s, or cut short by the client, closes the connection. Nothing a client
//! sends can panic the server or stop it accepting others.
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};

use crate::metrics::Metrics;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Largest request head (request line and headers) accepted (hyper's smallest read buffer).
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
            if let Err(error) = handle(stream, metrics, ready).await {
                tracing::debug!(%error, "http connection");
            }
            drop(permit);
        });
    }
}

/// One connection: one request served by hyper, then the connection closed.
async fn handle(stream: TcpStream, metrics: Metrics, ready: Arc<AtomicBool>) -> io::Result<()> {
    // A second handle on the socket, to close it properly once hyper is done with it.
    let stream = stream.into_std()?;
    let rest = stream.try_clone()?;
    let io = TokioIo::new(TcpStream::from_std(stream)?);
    let head_read = Arc::new(Notify::new());
    let service = {
        let head_read = head_read.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            head_read.notify_one();
            let response = route(&req, &metrics, &ready);
            async move { Ok::<_, Infallible>(response) }
        })
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false)
        .half_close(true)
        .title_case_headers(true)
        .auto_date_header(false)
        .serve_connection(io, service);
    let served = tokio::select! {
        biased;
        served = conn => served.map_err(io::Error::other),
        () = async {
            head_read.notified().await;
            tokio::time::sleep(WRITE_TIMEOUT).await;
        } => return Err(io::Error::new(io::ErrorKind::TimedOut, "write timeout")),
    };
    // Closing with unread input would reset the connection and could destroy the response
    // before the client reads it: end the output, then drain what is left for a moment.
    let _ = rest.shutdown(std::net::Shutdown::Write);
    let rest = TcpStream::from_std(rest)?;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain(&rest)).await;
    served
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

const TEXT: &str = "text/plain; charset=utf-8";

/// A response with a body of `content_type`, closing the connection.
fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    response(status, TEXT, format!("{body}\n"))
}

fn route(req: &Request<Incoming>, metrics: &Metrics, ready: &AtomicBool) -> Response<Full<Bytes>> {
    let (method, uri) = (req.method().as_str(), req.uri());
    // A path (`/...`, no scheme or host) and a method of letters.
    if uri.scheme().is_some()
        || uri.authority().is_some()
        || !uri.path().starts_with('/')
        || !method.bytes().all(|b| b.is_ascii_alphabetic())
    {
        return text(StatusCode::BAD_REQUEST, "bad request");
    }
    let path = uri.path();
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return text(StatusCode::NOT_FOUND, "not found");
    }
    let head = method.eq_ignore_ascii_case("HEAD");
    if !(head || method.eq_ignore_ascii_case("GET")) {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = match path {
        "/metrics" => response(StatusCode::OK, OPENMETRICS_CONTENT_TYPE, metrics.encode()),
        "/healthz" => text(StatusCode::OK, "ok"),
        _ if ready.load(Ordering::SeqCst) => text(StatusCode::OK, "ok"),
        _ => text(StatusCode::SERVICE_UNAVAILABLE, "not ready"),
    };
    // hyper leaves out the body of a HEAD (keeping its length); other spellings of HEAD get
    // no body either.
    if head && req.method() != hyper::Method::HEAD {
        *r.body_mut() = Full::default();
    }
    r
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

    #[tokio::test]
    async fn request_line_parsing() {
        let (addr, _) = start().await;
        // The query is not part of the path; HTTP/1.0 is understood.
        let r = raw(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        assert_eq!(status(&raw(addr, b"GET / HTTP/1.0\r\n\r\n").await), "404");
        // Nothing sent, nothing answered.
        assert_eq!(raw(addr, b"").await, "");
        // A method is letters only.
        assert_eq!(status(&raw(addr, b"G-T / HTTP/1.1\r\n\r\n").await), "400");
        // The head ends before the first empty line (CRLF or bare LF); an unfinished head is
        // not served.
        let r = raw(addr, b"GET /healthz HTTP/1.1\n\nrest").await;
        assert_eq!(status(&r), "200");
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert_eq!(status(&r), "200");
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\n").await;
        assert_ne!(status(&r), "200", "{r}");
    }
}
