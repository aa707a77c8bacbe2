//! kl's native extension, `kilolock._native`, with one Python submodule per job:
//! - `codec`: the native backend of `kilolock.codec`, cty JSON <-> cty msgpack, byte-identical to
//!   the pure-Python backend (kilolock/codec/pure/), laid out alike: each module here has a twin
//!   there of the same name (errors.rs is kilolock/codec/errors.py), with the same function names
//!   and error texts. order.rs alone has none: Python does that bookkeeping with dicts and sorted().
//! - `transport`: the HTTP/2 client kl's provider reads go through (transport.rs).
//! - `p256`: the AutoMTLS client key and certificate signature (p256.rs).

pub mod errors;
pub mod jsontext;
pub mod marshal;
pub mod mp;
pub mod numbers;
pub mod order;
#[cfg(feature = "transport")]
pub mod p256;
#[cfg(feature = "transport")]
pub mod transport;
pub mod types;
pub mod unmarshal;

pub use errors::{PathError, MAX_DEPTH};
pub use types::CtyType;

/// Compile a JSON type specification.
pub fn compile(type_json: &[u8]) -> Result<CtyType, PathError> {
    types::parse_type(type_json)
}

#[cfg(feature = "python")]
mod python {
    use super::*;
    use pyo3::prelude::*;
    use pyo3::sync::GILOnceCell;
    use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyType};
    use std::sync::mpsc::{Receiver, RecvTimeoutError};
    use std::sync::Mutex;
    use std::time::Duration;

    /// Inputs this large are worked on with the GIL released.
    const RELEASE_GIL_ABOVE: usize = 16 * 1024;

    static CODEC_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();

    /// The one `CodecError` class, defined in Python (kilolock.codec.errors) and raised from here.
    fn codec_error(py: Python<'_>, e: &PathError) -> PyErr {
        match CODEC_ERROR.import(py, "kilolock.codec.errors", "CodecError") {
            Ok(cls) => PyErr::from_type(cls.clone(), e.render()),
            Err(import_error) => import_error,
        }
    }

    /// Runs the codec on the bytes of a `bytes`/`bytearray` argument. A panic (a bug) becomes a
    /// CodecError too, so nothing but CodecError ever reaches Python from here.
    fn with_bytes<T: Send>(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        f: impl FnOnce(&[u8]) -> Result<T, PathError> + Send,
    ) -> PyResult<Result<T, PathError>> {
        let f = |b: &[u8]| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(b)))
                .unwrap_or_else(|_| Err(PathError::new("internal codec error (a bug: please report it)")))
        };
        if let Ok(b) = data.downcast::<PyBytes>() {
            let slice = b.as_bytes();
            if slice.len() > RELEASE_GIL_ABOVE {
                return Ok(py.allow_threads(|| f(slice)));
            }
            return Ok(f(slice));
        }
        if let Ok(b) = data.downcast::<PyByteArray>() {
            let owned = b.to_vec();
            return Ok(f(&owned));
        }
        let name = data.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into());
        Err(codec_error(py, &PathError::new(format!("expected bytes, got {}", name))))
    }

    /// A compiled type with the codec's two operations.
    #[pyclass(frozen, module = "kilolock._native.codec", name = "CodecType")]
    pub struct CodecType {
        ty: CtyType,
    }

    #[pymethods]
    impl CodecType {
        /// cty JSON -> msgpack exactly as go-cty writes it.
        fn encode<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
            let ty = &self.ty;
            match with_bytes(py, data, |b| marshal::encode(b, ty))? {
                Ok(v) => Ok(PyBytes::new(py, &v)),
                Err(e) => Err(codec_error(py, &e)),
            }
        }

        /// msgpack -> canonical cty JSON (sorted keys, compact, exact numbers).
        fn decode<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
            let ty = &self.ty;
            match with_bytes(py, data, |b| unmarshal::decode(b, ty))? {
                Ok(v) => Ok(PyBytes::new(py, &v)),
                Err(e) => Err(codec_error(py, &e)),
            }
        }

        /// The canonical JSON type specification.
        #[getter]
        fn type_json<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
            PyBytes::new(py, &self.ty.json())
        }
    }

    /// Compile Terraform's JSON type syntax into a reusable codec type.
    #[pyfunction]
    fn compile_type(py: Python<'_>, type_json: &Bound<'_, PyAny>) -> PyResult<CodecType> {
        match with_bytes(py, type_json, super::compile)? {
            Ok(ty) => Ok(CodecType { ty }),
            Err(e) => Err(codec_error(py, &e)),
        }
    }

    /// A fresh P-256 key for the AutoMTLS client certificate: (private scalar, 32 bytes; public
    /// point, 65 bytes uncompressed).
    #[pyfunction]
    #[pyo3(name = "generate")]
    fn p256_generate(py: Python<'_>) -> PyResult<(Bound<'_, PyBytes>, Bound<'_, PyBytes>)> {
        let (private, point) = crate::p256::generate().map_err(pyo3::exceptions::PyValueError::new_err)?;
        Ok((PyBytes::new(py, &private), PyBytes::new(py, &point)))
    }

    /// ECDSA-with-SHA-256 of MESSAGE by the key (PRIVATE, POINT): a DER Ecdsa-Sig-Value.
    #[pyfunction]
    #[pyo3(name = "sign")]
    fn p256_sign<'py>(py: Python<'py>, private: &[u8], point: &[u8], message: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let signature = crate::p256::sign(private, point, message).map_err(pyo3::exceptions::PyValueError::new_err)?;
        Ok(PyBytes::new(py, &signature))
    }

    /// One HTTP/2 connection to a plugin for its gRPC calls (transport.rs); used by
    /// kilolock.provider.h2channel. Connect failures raise OSError.
    #[pyclass(frozen, module = "kilolock._native.transport", name = "H2Channel")]
    pub struct H2Channel {
        channel: crate::transport::Channel,
    }

    #[pymethods]
    impl H2Channel {
        /// `tls`: (server certificate DER, client certificate PEM, client key PEM) for AutoMTLS.
        #[new]
        #[pyo3(signature = (target, max_message_bytes, tls=None))]
        fn new(py: Python<'_>, target: &str, max_message_bytes: usize, tls: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>) -> PyResult<Self> {
            let tls = tls.map(|(server_cert_der, client_cert_pem, client_key_pem)| crate::transport::Tls {
                server_cert_der,
                client_cert_pem,
                client_key_pem,
            });
            let channel = py.allow_threads(|| crate::transport::Channel::connect(target, tls.as_ref(), max_message_bytes));
            channel.map(|channel| H2Channel { channel }).map_err(pyo3::exceptions::PyOSError::new_err)
        }

        /// Readable when completions wait; read it empty, then call drain().
        fn wake_fd(&self) -> i32 {
            self.channel.wake_fd()
        }

        /// Queues a unary call, started at the next flush(); its completion comes out of drain() with this id.
        #[pyo3(signature = (id, path, message, timeout=None))]
        fn call(&self, id: u64, path: &str, message: &[u8], timeout: Option<f64>) -> PyResult<()> {
            self.channel.call(id, path, message, deadline(timeout)?);
            Ok(())
        }

        /// A unary call from a thread: waits (without the GIL) for (0, answer bytes) or
        /// (gRPC status code, message). Signals are checked every tenth of a second, so Ctrl-C
        /// interrupts the wait; the call itself then ends at its deadline or at close().
        #[pyo3(signature = (path, message, timeout=None))]
        fn call_blocking<'py>(&self, py: Python<'py>, path: &str, message: &[u8], timeout: Option<f64>) -> PyResult<(u32, Bound<'py, PyAny>)> {
            let mut answer = self.channel.call_blocking(path, message, deadline(timeout)?);
            loop {
                // Moved in and out: a Receiver may move between threads but not be shared.
                let (got, back) = py.allow_threads(move || (answer.recv_timeout(SIGNAL_CHECK), answer));
                answer = back;
                match got {
                    Ok(Ok(bytes)) => return Ok((0, PyBytes::new(py, &bytes).into_any())),
                    Ok(Err(status)) => return Ok((status.code, PyString::new(py, &status.message).into_any())),
                    Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Ok((crate::transport::UNAVAILABLE, PyString::new(py, "the channel was closed").into_any()))
                    }
                }
            }
        }

        /// Starts a server-streaming call; read it with H2Stream.recv().
        fn stream(&self, path: &str, message: &[u8]) -> H2Stream {
            H2Stream { events: Mutex::new(self.channel.open_stream(path, message)) }
        }

        /// Starts every queued call (one wake-up of the runtime's thread for all of them).
        fn flush(&self) {
            self.channel.flush();
        }

        /// [(id, 0, answer bytes) or (id, grpc status code, message)] for every finished call.
        fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
            let done = self.channel.drain();
            let list = PyList::empty(py);
            for c in done {
                let item = match c.outcome {
                    Ok(answer) => (c.id, 0u32, PyBytes::new(py, &answer).into_any()),
                    Err(status) => (c.id, status.code, PyString::new(py, &status.message).into_any()),
                };
                list.append(item)?;
            }
            Ok(list)
        }

        /// Ends the connection; calls in flight never complete.
        fn close(&self, py: Python<'_>) {
            py.allow_threads(|| self.channel.close());
        }
    }

    const SIGNAL_CHECK: Duration = Duration::from_millis(100);

    fn deadline(timeout: Option<f64>) -> PyResult<Option<Duration>> {
        match timeout {
            None => Ok(None),
            Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t.min(1e9)))),
            Some(t) => Err(pyo3::exceptions::PyValueError::new_err(format!("invalid timeout {t}"))),
        }
    }

    /// The messages of one server-streaming call, then its end.
    #[pyclass(frozen, module = "kilolock._native.transport", name = "H2Stream")]
    pub struct H2Stream {
        events: Mutex<Receiver<crate::transport::StreamEvent>>,
    }

    #[pymethods]
    impl H2Stream {
        /// Waits up to `timeout` seconds (without the GIL): the next message's bytes, or the end
        /// as (gRPC status code, message), 0 for OK; None when nothing came in time. After the
        /// end, or once the channel is closed, it returns an end at once.
        fn recv<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<Bound<'py, PyAny>>> {
            use crate::transport::StreamEvent;
            let limit = deadline(Some(timeout))?.unwrap_or(SIGNAL_CHECK);
            let event = py.allow_threads(|| self.events.lock().unwrap_or_else(|p| p.into_inner()).recv_timeout(limit));
            Ok(Some(match event {
                Ok(StreamEvent::Message(bytes)) => PyBytes::new(py, &bytes).into_any(),
                Ok(StreamEvent::End(Ok(()))) => (0u32, "").into_pyobject(py)?.into_any(),
                Ok(StreamEvent::End(Err(status))) => (status.code, status.message).into_pyobject(py)?.into_any(),
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => {
                    (crate::transport::CANCELLED, "the channel was closed").into_pyobject(py)?.into_any()
                }
            }))
        }
    }

    /// The extension's dotted name, under which each submodule is also in sys.modules.
    const PACKAGE: &str = "kilolock._native";

    /// Adds submodule NAME, filled by FILL, so that both `from kilolock._native import NAME` and
    /// `import kilolock._native.NAME` find it (an extension module is no package: the import
    /// system looks for its submodules in sys.modules only).
    fn submodule(parent: &Bound<'_, PyModule>, name: &str, fill: impl FnOnce(&Bound<'_, PyModule>) -> PyResult<()>) -> PyResult<()> {
        let py = parent.py();
        // Named in full from the start: its functions and classes take their __module__ from it.
        let dotted = format!("{PACKAGE}.{name}");
        let sub = PyModule::new(py, &dotted)?;
        // Each job's version too: the transport's names its client in the AutoMTLS memo.
        sub.add("__version__", env!("CARGO_PKG_VERSION"))?;
        fill(&sub)?;
        parent.add(name, &sub)?;
        py.import("sys")?.getattr("modules")?.set_item(dotted, &sub)?;
        Ok(())
    }

    #[pymodule]
    fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        submodule(m, "codec", |codec| {
            codec.add("MAX_DEPTH", MAX_DEPTH)?;
            codec.add_class::<CodecType>()?;
            codec.add_function(wrap_pyfunction!(compile_type, codec)?)
        })?;
        submodule(m, "transport", |transport| {
            transport.add_class::<H2Channel>()?;
            transport.add_class::<H2Stream>()
        })?;
        submodule(m, "p256", |p256| {
            p256.add_function(wrap_pyfunction!(p256_generate, p256)?)?;
            p256.add_function(wrap_pyfunction!(p256_sign, p256)?)
        })
    }
}
