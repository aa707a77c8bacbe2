//! The codec's path-collecting error (twin of PathError in kilolock/codec/errors.py): a message
//! plus the path steps collected while it unwinds, rendered as Terraform writes a path,
//! `rules[3].cidr: expected string, got number` (no leading dot), or the message alone for an
//! error about the whole value: the same text the Python backend produces with
//! `kilolock.schema.path_display`, the one printed form of a path in kl.

use crate::jsontext::write_json_string;

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// An object attribute: `.name` (the dot only after another step).
    Attr(String),
    /// A list, set or tuple element: `[3]`.
    Index(usize),
    /// A map key as a JSON string that keeps UTF-8: `["env"]`.
    Key(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct PathError {
    pub message: String,
    /// Innermost first; reversed when rendered.
    pub segments: Vec<Step>,
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
        let steps: &[Step] = if self.at_root { &[] } else { &self.segments };
        if steps.is_empty() {
            return self.message.clone();
        }
        let mut path = Vec::new();
        for (n, step) in steps.iter().rev().enumerate() {
            match step {
                Step::Attr(name) => {
                    // After another step, not after other text: an attribute named "" is a step
                    // that writes nothing, and the one after it still gets its dot.
                    if n > 0 {
                        path.push(b'.');
                    }
                    path.extend_from_slice(name.as_bytes());
                }
                Step::Index(i) => path.extend_from_slice(format!("[{}]", i).as_bytes()),
                Step::Key(key) => {
                    path.push(b'[');
                    write_json_string(&mut path, key);
                    path.push(b']');
                }
            }
        }
        format!("{}: {}", String::from_utf8_lossy(&path), self.message)
    }
}

/// Adds a path step to an error on its way out.
pub trait AtStep<T> {
    fn at(self, step: impl FnOnce() -> Step) -> Result<T>;
}

impl<T> AtStep<T> for Result<T> {
    #[inline]
    fn at(self, step: impl FnOnce() -> Step) -> Result<T> {
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
