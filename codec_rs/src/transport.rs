//! gRPC over HTTP/2 (the `h2` crate on a one-thread tokio runtime): kl's client for a provider
//! plugin. Python keeps everything else: it builds the request bytes, parses the answers with its
//! generated protobuf classes and drives its threads and asyncio loop. This module only frames a
//! message, sends it on its own stream and hands back the answer's message bytes (or, for a
//! server-streaming call, each message as it comes) and the gRPC status.
//!
//! Why: through grpcio, each ReadResource costs the Python event loop ~120 µs of CPU in grpc.aio's
//! own code; here a call is one method call to start and a share of one batched wake-up to finish,
//! and the HTTP/2 work runs on the runtime's thread without the GIL. A small refresh does not import
//! grpc at all, and the TLS handshake runs without the GIL while the main thread imports.
//!
//! A finished call goes where its caller waits ([`Reply`]): the event loop's completions are queued
//! in an inbox, and the first one after a drain writes one byte to a socket whose other end the
//! loop watches (asyncio's `add_reader`); draining clears the flag under the same lock, so no
//! completion is ever left without a byte to announce it. A blocking caller (a thread) waits on a
//! channel of its own, as does the reader of a server stream.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderMap, Method, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::runtime::Runtime;
use tokio::sync::Notify;

/// gRPC status codes used here (grpc/doc/statuscodes.md).
pub const CANCELLED: u32 = 1;
pub const UNKNOWN: u32 = 2;
pub const DEADLINE_EXCEEDED: u32 = 4;
pub const PERMISSION_DENIED: u32 = 7;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const UNIMPLEMENTED: u32 = 12;
pub const INTERNAL: u32 = 13;
pub const UNAVAILABLE: u32 = 14;
pub const UNAUTHENTICATED: u32 = 16;

/// A gRPC status other than OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: u32,
    pub message: String,
}

impl Status {
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }
}

/// One finished call: the caller's id and the answer's message bytes or its status.
pub struct Completion {
    pub id: u64,
    pub outcome: Result<Bytes, Status>,
}

struct Inbox {
    items: Vec<Completion>,
    signalled: bool,
    wake: StdUnixStream,
}

fn locked(inbox: &Mutex<Inbox>) -> MutexGuard<'_, Inbox> {
    // A panic while holding the lock cannot leave the Vec half-updated in a way that matters.
    inbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn deliver(inbox: &Mutex<Inbox>, completion: Completion) {
    let mut inbox = locked(inbox);
    inbox.items.push(completion);
    if !inbox.signalled {
        inbox.signalled = true;
        // Non-blocking, and at most one byte is unread at a time: it cannot fail for lack of room.
        let _ = (&inbox.wake).write(&[1]);
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// go-plugin AutoMTLS, as grpcio does it for kl: our client certificate, and the server's
/// certificate exactly as its handshake line gave it (kl's `PluginConnection` keeps both).
pub struct Tls {
    pub server_cert_der: Vec<u8>,
    pub client_cert_pem: Vec<u8>,
    pub client_key_pem: Vec<u8>,
}

/// Accepts the one certificate the plugin announced, and checks the handshake's signatures with
/// it. go-plugin's clients use that certificate as the only root; pinning it is the same trust,
/// without webpki's refusal of a CA certificate as the end entity (go-plugin's is a CA).
#[derive(Debug)]
struct PinnedServer {
    cert: Vec<u8>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_slice() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

fn tls_connector(tls: &Tls) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = PinnedServer { cert: tls.server_cert_der.clone(), algorithms: provider.signature_verification_algorithms };
    let chain = CertificateDer::pem_slice_iter(&tls.client_cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("client certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.client_key_pem).map_err(|e| format!("client key: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("client certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn open_io(target: &str, tls: Option<&Tls>) -> Result<Box<dyn Io>, String> {
    let plain = open_plain(target).await.map_err(|e| format!("cannot connect to {target}: {e}"))?;
    let Some(tls) = tls else {
        return Ok(plain);
    };
    let connector = tls_connector(tls)?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let stream = connector.connect(name, plain).await.map_err(|e| format!("TLS handshake with {target} failed: {e}"))?;
    Ok(Box::new(stream))
}

async fn open_plain(target: &str) -> std::io::Result<Box<dyn Io>> {
    // grpc target syntax as go-plugin's handshake gives it to kl: "unix:/path" or "host:port".
    if let Some(path) = target.strip_prefix("unix:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        return Ok(Box::new(tokio::net::UnixStream::connect(path).await?));
    }
    let stream = tokio::net::TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(Box::new(stream))
}

struct Live {
    runtime: Runtime,
    sender: SendRequest<Bytes>,
}

/// What a server-streaming call yields: each message, then its end (the gRPC status).
#[derive(Debug)]
pub enum StreamEvent {
    Message(Bytes),
    End(Result<(), Status>),
}

/// Where a finished call's outcome goes.
enum Reply {
    /// The event loop's calls: the inbox, announced on the wake socket, with the caller's id.
    Inbox(u64),
    /// A thread blocked in `call_blocking`.
    Direct(SyncSender<Result<Bytes, Status>>),
    /// The reader of a server-streaming call.
    Stream(Sender<StreamEvent>),
}

/// A call waiting for the dispatcher to start it.
struct Queued {
    reply: Reply,
    uri: String,
    frame: Bytes,
    timeout: Option<Duration>,
}

/// The answer of a call whose deadline may pass first. The plugin keeps the same deadline (the
/// `grpc-timeout` header) and resets the stream when it passes: that reset can be seen before this
/// side's timer is, so a cancel that comes at or after the deadline is the deadline too.
async fn within<F: std::future::Future<Output = Result<Bytes, Status>>>(timeout: Option<Duration>, call: F) -> Result<Bytes, Status> {
    match timeout {
        Some(limit) => {
            let started = tokio::time::Instant::now();
            match tokio::time::timeout(limit, call).await {
                Ok(Err(status)) if status.code == CANCELLED && started.elapsed() >= limit => Err(deadline_exceeded()),
                Ok(answer) => answer,
                Err(_) => Err(deadline_exceeded()),
            }
        }
        None => call.await,
    }
}

fn deadline_exceeded() -> Status {
    Status::new(DEADLINE_EXCEEDED, "Deadline Exceeded")
}

/// Calls are queued by `call` and started by one dispatcher task when `flush` wakes it: the caller
/// queues every call of one event-loop turn and flushes once, so the runtime's thread is woken
/// (a futex wake and, on two cores, often a context switch) once per turn rather than per call.
/// Spawning from inside the runtime is a push on its local queue.
async fn dispatch(sender: SendRequest<Bytes>, outbox: Arc<Mutex<Vec<Queued>>>, wake: Arc<Notify>, inbox: Arc<Mutex<Inbox>>, max: usize) {
    loop {
        wake.notified().await;
        let batch = std::mem::take(&mut *outbox.lock().unwrap_or_else(|p| p.into_inner()));
        for request in batch {
            let (sender, inbox) = (sender.clone(), Arc::clone(&inbox));
            let Queued { reply, uri, frame, timeout } = request;
            tokio::spawn(async move {
                match reply {
                    Reply::Inbox(id) => {
                        let outcome = within(timeout, unary(sender, uri, frame, timeout, max)).await;
                        deliver(&inbox, Completion { id, outcome });
                    }
                    Reply::Direct(waiter) => {
                        let _ = waiter.send(within(timeout, unary(sender, uri, frame, timeout, max)).await);
                    }
                    Reply::Stream(events) => {
                        let end = server_stream(sender, uri, frame, max, &events).await;
                        let _ = events.send(StreamEvent::End(end));
                    }
                }
            });
        }
    }
}

/// One HTTP/2 connection to a plugin's gRPC server: TLS (AutoMTLS) where kl's grpcio channel to
/// the same plugin uses it, plaintext where that does.
pub struct Channel {
    live: Mutex<Option<Live>>,
    outbox: Arc<Mutex<Vec<Queued>>>,
    dispatcher: Arc<Notify>,
    inbox: Arc<Mutex<Inbox>>,
    wake_reader: StdUnixStream,
}

impl Channel {
    /// Connects and completes the HTTP/2 preface; `max_message` bounds an answer's size.
    pub fn connect(target: &str, tls: Option<&Tls>, max_message: usize) -> Result<Channel, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kl-h2")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start the HTTP/2 runtime: {e}"))?;
        let sender = runtime.block_on(async {
            let io = open_io(target, tls).await?;
            let (sender, connection) = h2::client::Builder::new()
                // Big answers (a 150-attribute cloud object) in one window, as grpcio's BDP probing would reach.
                .initial_window_size(4 << 20)
                .initial_connection_window_size(32 << 20)
                .handshake::<_, Bytes>(io)
                .await
                .map_err(|e| format!("HTTP/2 handshake with {target} failed: {e}"))?;
            tokio::spawn(async move {
                let _ = connection.await; // ends with the connection; calls then fail UNAVAILABLE
            });
            sender.ready().await.map_err(|e| format!("HTTP/2 connection to {target} failed: {e}"))
        })?;
        let (wake_reader, wake) = StdUnixStream::pair().map_err(|e| format!("cannot make a wake-up socket: {e}"))?;
        wake.set_nonblocking(true).map_err(|e| e.to_string())?;
        wake_reader.set_nonblocking(true).map_err(|e| e.to_string())?;
        let inbox = Arc::new(Mutex::new(Inbox { items: Vec::new(), signalled: false, wake }));
        let outbox = Arc::new(Mutex::new(Vec::new()));
        let dispatcher = Arc::new(Notify::new());
        runtime.spawn(dispatch(sender.clone(), Arc::clone(&outbox), Arc::clone(&dispatcher), Arc::clone(&inbox), max_message));
        Ok(Channel { live: Mutex::new(Some(Live { runtime, sender })), outbox, dispatcher, inbox, wake_reader })
    }

    /// The file descriptor that becomes readable when completions wait in the inbox.
    pub fn wake_fd(&self) -> i32 {
        self.wake_reader.as_raw_fd()
    }

    fn closed(&self) -> bool {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    fn queue(&self, reply: Reply, path: &str, message: &[u8], timeout: Option<Duration>) {
        let request = Queued { reply, uri: format!("http://localhost{path}"), frame: frame(message), timeout };
        self.outbox.lock().unwrap_or_else(|p| p.into_inner()).push(request);
    }

    /// Queues a unary call of `path` ("/package.Service/Method"); its completion carries `id`.
    /// It starts at the next `flush`. After `close`, the call completes at once with UNAVAILABLE.
    pub fn call(&self, id: u64, path: &str, message: &[u8], timeout: Option<Duration>) {
        if self.closed() {
            deliver(&self.inbox, Completion { id, outcome: Err(Status::new(UNAVAILABLE, "the channel is closed")) });
            return;
        }
        self.queue(Reply::Inbox(id), path, message, timeout);
    }

    /// Starts a unary call now, for a caller that waits for it on the returned receiver (which
    /// reports a disconnect if the channel closes first).
    pub fn call_blocking(&self, path: &str, message: &[u8], timeout: Option<Duration>) -> Receiver<Result<Bytes, Status>> {
        let (waiter, answer) = std::sync::mpsc::sync_channel(1);
        if self.closed() {
            let _ = waiter.send(Err(Status::new(UNAVAILABLE, "the channel is closed")));
        } else {
            self.queue(Reply::Direct(waiter), path, message, timeout);
            self.dispatcher.notify_one();
        }
        answer
    }

    /// Starts a server-streaming call now: its messages, then its end, arrive on the receiver.
    /// Dropping the receiver ends the call (its stream is reset at the next message).
    pub fn open_stream(&self, path: &str, message: &[u8]) -> Receiver<StreamEvent> {
        let (events, receiver) = std::sync::mpsc::channel();
        if self.closed() {
            let _ = events.send(StreamEvent::End(Err(Status::new(UNAVAILABLE, "the channel is closed"))));
        } else {
            self.queue(Reply::Stream(events), path, message, None);
            self.dispatcher.notify_one();
        }
        receiver
    }

    /// Starts every queued call.
    pub fn flush(&self) {
        self.dispatcher.notify_one();
    }

    /// Every completion queued since the last drain, in order of completion.
    pub fn drain(&self) -> Vec<Completion> {
        let mut inbox = locked(&self.inbox);
        inbox.signalled = false;
        std::mem::take(&mut inbox.items)
    }

    /// Ends the connection; calls in flight are dropped (their streams reset) without completing,
    /// so a blocking caller's or a stream reader's receiver reports a disconnect.
    pub fn close(&self) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Live { runtime, sender }) = live {
            drop(sender);
            runtime.shutdown_background();
        }
        drop(std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner())));
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.close();
    }
}

/// The gRPC length-prefixed message: uncompressed flag, 4-byte big-endian length, the bytes.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// The message in a unary answer's body: exactly one uncompressed length-prefixed message.
pub fn unframe(body: Bytes, max_message: usize) -> Result<Bytes, Status> {
    if body.len() < 5 {
        return Err(Status::new(INTERNAL, "the server closed the stream without a response message"));
    }
    if body[0] != 0 {
        return Err(Status::new(INTERNAL, "the server sent a compressed message, which was not asked for"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > max_message {
        return Err(Status::new(RESOURCE_EXHAUSTED, format!("received message larger than max ({len} vs. {max_message})")));
    }
    if body.len() != 5 + len {
        return Err(Status::new(INTERNAL, format!("malformed response body: {} bytes for a {len}-byte message", body.len())));
    }
    Ok(body.slice(5..))
}

/// `grpc-timeout`: at most 8 digits and a unit.
pub fn timeout_header(limit: Duration) -> String {
    let millis = limit.as_millis().max(1);
    if millis < 100_000_000 {
        format!("{millis}m")
    } else {
        format!("{}S", limit.as_secs().min(99_999_999))
    }
}

/// The gRPC status in a header block (trailers, or the headers of a trailers-only answer).
pub fn status_of(headers: &HeaderMap) -> Option<Result<(), Status>> {
    let code = headers.get("grpc-status")?;
    let code = code.to_str().ok().and_then(|c| c.parse::<u32>().ok()).unwrap_or(UNKNOWN);
    if code == 0 {
        return Some(Ok(()));
    }
    let message = headers.get("grpc-message").map(|m| percent_decode(m.as_bytes())).unwrap_or_default();
    Some(Err(Status::new(code, message)))
}

/// grpc-message is percent-encoded UTF-8.
pub fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            let hex = std::str::from_utf8(&raw[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// gRPC's mapping of an HTTP status that is not 200 (grpc/doc/http-grpc-status-mapping.md).
pub fn http_status(status: StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => UNKNOWN,
    };
    Status::new(code, format!("unexpected HTTP status {status} from the plugin"))
}

fn h2_status(e: h2::Error) -> Status {
    if e.reason() == Some(h2::Reason::CANCEL) {
        return Status::new(CANCELLED, format!("stream cancelled: {e}"));
    }
    Status::new(UNAVAILABLE, format!("HTTP/2: {e}"))
}

/// Sends the request; the answer's body once its headers say it carries messages (a trailers-only
/// answer is its status).
async fn start(sender: SendRequest<Bytes>, uri: String, frame: Bytes, timeout: Option<Duration>) -> Result<h2::RecvStream, Status> {
    let mut sender = sender.ready().await.map_err(h2_status)?;
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(limit) = timeout {
        request = request.header("grpc-timeout", timeout_header(limit));
    }
    let request = request.body(()).map_err(|e| Status::new(INTERNAL, format!("cannot build the request: {e}")))?;
    let (response, mut stream) = sender.send_request(request, false).map_err(h2_status)?;
    stream.send_data(frame, true).map_err(h2_status)?;
    let (head, body) = response.await.map_err(h2_status)?.into_parts();
    if head.status != StatusCode::OK {
        return Err(http_status(head.status));
    }
    if let Some(Err(status)) = status_of(&head.headers) {
        return Err(status); // trailers-only answer: an error and no message
    }
    Ok(body)
}

/// The status in the trailers that end a stream.
async fn final_status(body: &mut h2::RecvStream) -> Result<(), Status> {
    let trailers = body.trailers().await.map_err(h2_status)?;
    match trailers.as_ref().and_then(status_of) {
        Some(result) => result,
        None => Err(Status::new(INTERNAL, "the server ended the stream without a grpc-status")),
    }
}

async fn unary(sender: SendRequest<Bytes>, uri: String, frame: Bytes, timeout: Option<Duration>, max: usize) -> Result<Bytes, Status> {
    let mut body = start(sender, uri, frame, timeout).await?;
    let mut buf = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_status)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        // Most answers arrive in one DATA frame: keep it as it came rather than copy it.
        match first.take() {
            None if buf.is_empty() => first = Some(chunk),
            Some(earlier) => {
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&chunk);
            }
            None => buf.extend_from_slice(&chunk),
        }
        if buf.len() > max.saturating_add(5) {
            return Err(Status::new(RESOURCE_EXHAUSTED, format!("received message larger than max ({max} bytes)")));
        }
    }
    final_status(&mut body).await?;
    unframe(first.unwrap_or_else(|| buf.freeze()), max)
}

/// The complete messages at the front of `buf`, taken out of it; what remains is the start of
/// the next one.
pub fn split_messages(buf: &mut BytesMut, max: usize) -> Result<Vec<Bytes>, Status> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        if buf[0] != 0 {
            return Err(Status::new(INTERNAL, "the server sent a compressed message, which was not asked for"));
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > max {
            return Err(Status::new(RESOURCE_EXHAUSTED, format!("received message larger than max ({len} vs. {max})")));
        }
        if buf.len() < 5 + len {
            break;
        }
        let mut message = buf.split_to(5 + len);
        out.push(message.split_off(5).freeze());
    }
    Ok(out)
}

/// A server-streaming call: each message goes to `events` as it is complete; the status is
/// returned. Ends early, resetting the stream, when nobody listens any more.
async fn server_stream(sender: SendRequest<Bytes>, uri: String, frame: Bytes, max: usize, events: &Sender<StreamEvent>) -> Result<(), Status> {
    let mut body = start(sender, uri, frame, None).await?;
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_status)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        for message in split_messages(&mut buf, max)? {
            if events.send(StreamEvent::Message(message)).is_err() {
                return Err(Status::new(CANCELLED, "the reader went away"));
            }
        }
    }
    final_status(&mut body).await?;
    if buf.is_empty() {
        Ok(())
    } else {
        Err(Status::new(INTERNAL, format!("the stream ended inside a message ({} bytes left)", buf.len())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let framed = frame(b"abc");
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x03abc");
        assert_eq!(unframe(framed, 16).unwrap(), Bytes::from_static(b"abc"));
    }

    #[test]
    fn unframe_rejects_what_grpc_rejects() {
        let cases: &[(&[u8], u32)] = &[
            (b"", INTERNAL),
            (b"\x00\x00\x00", INTERNAL),
            (b"\x01\x00\x00\x00\x01a", INTERNAL),
            (b"\x00\x00\x00\x00\x02a", INTERNAL),
            (b"\x00\x00\x00\x00\x01ab", INTERNAL),
            (b"\x00\x00\x00\x01\x00", RESOURCE_EXHAUSTED),
        ];
        for (body, code) in cases {
            assert_eq!(unframe(Bytes::copy_from_slice(body), 16).unwrap_err().code, *code, "{body:?}");
        }
    }

    #[test]
    fn stream_messages_split_where_they_end() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"\x00\x00\x00\x00\x02ab\x00\x00\x00\x00\x00\x00\x00\x00");
        let got = split_messages(&mut buf, 16).unwrap();
        assert_eq!(got, vec![Bytes::from_static(b"ab"), Bytes::new()]);
        assert_eq!(&buf[..], b"\x00\x00\x00"); // the next message's prefix, not yet whole
        buf.extend_from_slice(b"\x00\x01z");
        assert_eq!(split_messages(&mut buf, 16).unwrap(), vec![Bytes::from_static(b"z")]);
        assert!(buf.is_empty());
        let mut big = BytesMut::from(&b"\x00\x00\x00\x01\x00"[..]);
        assert_eq!(split_messages(&mut big, 16).unwrap_err().code, RESOURCE_EXHAUSTED);
        let mut packed = BytesMut::from(&b"\x01\x00\x00\x00\x00"[..]);
        assert_eq!(split_messages(&mut packed, 16).unwrap_err().code, INTERNAL);
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
    }

    #[test]
    fn a_cancel_at_the_deadline_is_the_deadline() {
        let limit = Duration::from_millis(10);
        let cancelled = || Err(Status::new(CANCELLED, "stream cancelled: stream no longer needed"));
        // The plugin's reset, read before this side's timer: the call ends cancelled past its limit.
        let late = run(within(Some(limit), async move {
            std::thread::sleep(limit * 2);
            cancelled()
        }));
        assert_eq!(late.unwrap_err().code, DEADLINE_EXCEEDED);
        // A cancel well before the deadline is what it says.
        assert_eq!(run(within(Some(Duration::from_secs(5)), async move { cancelled() })).unwrap_err().code, CANCELLED);
        // No answer at all: the timer.
        let silent = run(within(Some(limit), std::future::pending::<Result<Bytes, Status>>()));
        assert_eq!(silent.unwrap_err().code, DEADLINE_EXCEEDED);
        assert_eq!(run(within(None, async { Ok(Bytes::from_static(b"x")) })).unwrap(), Bytes::from_static(b"x"));
    }

    #[test]
    fn timeouts_fit_eight_digits() {
        let cases = [(Duration::from_millis(0), "1m"), (Duration::from_secs(30), "30000m"), (Duration::from_secs(200_000), "200000S")];
        for (limit, want) in cases {
            assert_eq!(timeout_header(limit), want);
        }
    }

    #[test]
    fn status_from_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(status_of(&h), None);
        h.insert("grpc-status", "0".parse().unwrap());
        assert_eq!(status_of(&h), Some(Ok(())));
        h.insert("grpc-status", "14".parse().unwrap());
        h.insert("grpc-message", "plugin %E2%9C%93 gone%2".parse().unwrap());
        assert_eq!(status_of(&h), Some(Err(Status::new(UNAVAILABLE, "plugin \u{2713} gone%2"))));
        h.insert("grpc-status", "x".parse().unwrap());
        assert_eq!(status_of(&h).unwrap().unwrap_err().code, UNKNOWN);
    }

    #[test]
    fn http_errors_map_as_grpc_does() {
        assert_eq!(http_status(StatusCode::NOT_FOUND).code, UNIMPLEMENTED);
        assert_eq!(http_status(StatusCode::SERVICE_UNAVAILABLE).code, UNAVAILABLE);
        assert_eq!(http_status(StatusCode::IM_A_TEAPOT).code, UNKNOWN);
    }
}
