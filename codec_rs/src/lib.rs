//! Native backend of `kilolock.codec`. The real codec lands with the codec issue; this module
//! exists so the package builds and `kilolock.codec` can report which backend is active.
use pyo3::prelude::*;

#[pymodule]
fn _codec_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
