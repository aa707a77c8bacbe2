//! The codec's path-collecting error (twin of PathError in kilolock/codec/errors.py): a message
//! plus the path segments collected while it unwinds, rendered as
//! `.rules[3].cidr: expected string, got number`, the same text the Python backend produces.

#[derive(Debug, Clone, PartialEq)]
pub struct PathError {
    pub message: String,
    /// Innermost first; reversed when rendered.
    pub segments: Vec<String>,
    /// Errors about the JSON text as a whole are reported at the root, as a whole-document
    /// parser (the Python backend's) reports them.
    pub at_root: bool,
}

pub type Result<T> = std::result::Result<T, PathError>;

impl PathError {
    pub fn new(message: impl Into<String>) -> Self {
        PathError { message: message.into(), segments: Vec::new(), at_root: false }
    }

    pub fn invalid_json(detail: impl AsRef<str>) -> Self {
        PathError { message: format!("invalid JSON: {}", detail.as_ref()), segments: Vec::new(), at_root: true }
    }

    pub fn render(&self) -> String {
        let path: String = if self.at_root {
            String::new()
        } else {
            self.segments.iter().rev().map(String::as_str).collect()
        };
        let path = if path.is_empty() { "(root)" } else { path.as_str() };
        format!("{}: {}", path, self.message)
    }
}

/// Adds a path step to an error on its way out.
pub trait AtStep<T> {
    fn at(self, step: impl FnOnce() -> String) -> Result<T>;
}

impl<T> AtStep<T> for Result<T> {
    #[inline]
    fn at(self, step: impl FnOnce() -> String) -> Result<T> {
        match self {
            Ok(v) => Ok(v),
            Err(mut e) => {
                e.segments.push(step());
                Err(e)
            }
        }
    }
}

pub const MAX_DEPTH: usize = 64;

pub fn too_deep() -> PathError {
    PathError::new(format!("nested deeper than {} levels", MAX_DEPTH))
}
