//! Strict JSON reading (a cursor the marshaller streams through, plus a small tree for dynamic
//! values and type specs) and canonical JSON string writing, matching Python's `json` module:
//! the same grammar, the same escapes on output (twin of kilolock/codec/pure/jsontext.py).
//!
//! The reader is the codec's own, not serde_json's: the marshaller walks the text with the cty
//! type in hand and builds no tree for it, and where serde_json's tree differs from the Python
//! twin the behaviour would change: it keeps one of two repeated keys (here the value or type
//! spec is refused naming the key), it refuses an unpaired surrogate escape as a syntax error (here
//! a value error at its path, as in the Python twin), and it stops nesting at 128 (here 1000).
//! The writer's escapes are serde_json's, which are Python's byte for byte.

use crate::errors::{PathError, Result};
use crate::numbers::{parse_number, scan_number, OUT_OF_RANGE};
use std::borrow::Cow;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Nesting limit of the JSON text itself (the value walk enforces the codec's own, smaller one).
pub const JSON_NESTING_LIMIT: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "bool",
            Kind::Number => "number",
            Kind::String => "string",
            Kind::Array => "array",
            Kind::Object => "object",
        }
    }
}

#[derive(Debug, Clone)]
pub enum JVal {
    Null,
    Bool(bool),
    Num(Vec<u8>),
    Str(String),
    Arr(Vec<JVal>),
    Obj(Vec<(String, JVal)>),
}

pub struct Parser<'a> {
    pub s: &'a [u8],
    pub pos: usize,
}

pub fn unpaired_surrogate() -> PathError {
    PathError::new("invalid string: unpaired surrogate escape")
}

impl<'a> Parser<'a> {
    /// A parser over UTF-8-checked JSON text.
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if let Err(e) = std::str::from_utf8(data) {
            return Err(PathError::invalid_json(format!("invalid UTF-8 at byte {}", e.valid_up_to())));
        }
        Ok(Parser { s: data, pos: 0 })
    }

    pub fn syntax(&self, what: &str) -> PathError {
        PathError::invalid_json(format!("{} at byte {}", what, self.pos))
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while let Some(&c) = self.s.get(self.pos) {
            if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// The kind of the value starting here (after whitespace).
    #[inline]
    pub fn peek_kind(&mut self) -> Result<Kind> {
        self.skip_ws();
        match self.s.get(self.pos) {
            Some(b'"') => Ok(Kind::String),
            Some(b'{') => Ok(Kind::Object),
            Some(b'[') => Ok(Kind::Array),
            Some(b't') | Some(b'f') => Ok(Kind::Bool),
            Some(b'n') => Ok(Kind::Null),
            Some(b'-') | Some(b'0'..=b'9') => Ok(Kind::Number),
            Some(_) => Err(self.syntax("expecting a value")),
            None => Err(self.syntax("expecting a value, got the end")),
        }
    }

    pub fn finish(&mut self) -> Result<()> {
        self.skip_ws();
        if self.pos != self.s.len() {
            return Err(self.syntax("extra data"));
        }
        Ok(())
    }

    pub fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    pub fn parse_bool(&mut self) -> Result<bool> {
        if self.s[self.pos] == b't' {
            self.literal(b"true")?;
            Ok(true)
        } else {
            self.literal(b"false")?;
            Ok(false)
        }
    }

    /// The number's text, grammar-checked; range-checked as the whole-document parser does.
    pub fn number_text(&mut self) -> Result<&'a [u8]> {
        let rest = &self.s[self.pos..];
        let n = scan_number(rest).ok_or_else(|| self.syntax("invalid number"))?;
        let text = &rest[..n];
        self.pos += n;
        Ok(text)
    }

    pub fn checked_number_text(&mut self) -> Result<&'a [u8]> {
        let text = self.number_text()?;
        // Short integer literals are always in range; longer ones are checked exactly.
        if text.len() > 18 || text.iter().any(|&c| c == b'.' || c == b'e' || c == b'E') {
            if let Err(e) = parse_number(text) {
                return Err(PathError::invalid_json(if e == OUT_OF_RANGE { OUT_OF_RANGE } else { e }));
            }
        }
        Ok(text)
    }

    /// `{` or `[` already peeked: consume it.
    #[inline]
    pub fn bump(&mut self) {
        self.pos += 1;
    }

    /// After an element: `,` (true, more follow) or the closing byte (false).
    #[inline]
    pub fn next_or_close(&mut self, close: u8) -> Result<bool> {
        self.skip_ws();
        match self.s.get(self.pos) {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(&c) if c == close => {
                self.pos += 1;
                Ok(false)
            }
            _ => Err(self.syntax("expecting ',' or a closing bracket")),
        }
    }

    /// Right after `[` or `{`: true if the container is empty (and consumes the close).
    #[inline]
    pub fn empty_close(&mut self, close: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.pos) == Some(&close) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// An object key and its colon.
    pub fn key(&mut self) -> Result<Cow<'a, str>> {
        self.skip_ws();
        if self.s.get(self.pos) != Some(&b'"') {
            return Err(self.syntax("expecting a property name in double quotes"));
        }
        let k = self.string()?;
        self.skip_ws();
        if self.s.get(self.pos) != Some(&b':') {
            return Err(self.syntax("expecting ':'"));
        }
        self.pos += 1;
        Ok(k)
    }

    /// A string starting at the opening quote.
    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        let s = self.s;
        let start = self.pos + 1;
        let mut i = start;
        // Fast path: no escapes.
        loop {
            match s.get(i) {
                None => {
                    self.pos = i;
                    return Err(self.syntax("unterminated string"));
                }
                Some(b'"') => {
                    self.pos = i + 1;
                    // The whole input was UTF-8-checked and quotes/backslashes are ASCII.
                    return Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(&s[start..i]) }));
                }
                Some(b'\\') => break,
                Some(&c) if c < 0x20 => {
                    self.pos = i;
                    return Err(self.syntax("invalid control character in string"));
                }
                Some(_) => i += 1,
            }
        }
        let mut buf: Vec<u8> = s[start..i].to_vec();
        loop {
            match s.get(i) {
                None => {
                    self.pos = i;
                    return Err(self.syntax("unterminated string"));
                }
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(Cow::Owned(String::from_utf8(buf).map_err(|_| self.syntax("invalid string"))?));
                }
                Some(b'\\') => {
                    let esc = s.get(i + 1).copied();
                    i += 2;
                    match esc {
                        Some(b'"') => buf.push(b'"'),
                        Some(b'\\') => buf.push(b'\\'),
                        Some(b'/') => buf.push(b'/'),
                        Some(b'b') => buf.push(0x08),
                        Some(b'f') => buf.push(0x0c),
                        Some(b'n') => buf.push(b'\n'),
                        Some(b'r') => buf.push(b'\r'),
                        Some(b't') => buf.push(b'\t'),
                        Some(b'u') => {
                            self.pos = i;
                            let hi = self.hex4(i)?;
                            i += 4;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if s.get(i) == Some(&b'\\') && s.get(i + 1) == Some(&b'u') {
                                    self.pos = i + 2;
                                    let lo = self.hex4(i + 2)?;
                                    if (0xDC00..0xE000).contains(&lo) {
                                        i += 6;
                                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                    } else {
                                        return Err(self.surrogate_error(i));
                                    }
                                } else {
                                    return Err(self.surrogate_error(i));
                                }
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return Err(self.surrogate_error(i));
                            } else {
                                hi
                            };
                            let ch = char::from_u32(code).expect("valid scalar");
                            let mut tmp = [0u8; 4];
                            buf.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
                        }
                        _ => {
                            self.pos = i - 1;
                            return Err(self.syntax("invalid escape"));
                        }
                    }
                }
                Some(&c) if c < 0x20 => {
                    self.pos = i;
                    return Err(self.syntax("invalid control character in string"));
                }
                Some(&c) => {
                    buf.push(c);
                    i += 1;
                }
            }
        }
    }

    /// An unpaired surrogate is well-formed JSON that no UTF-8 string can hold: a value error at
    /// the current path (as in the Python backend), once the rest of the string is known valid.
    fn surrogate_error(&mut self, from: usize) -> PathError {
        // Skip to the closing quote so syntax errors later in the string still win, as they do
        // in a whole-document parse.
        let s = self.s;
        let mut i = from;
        while i < s.len() && s[i] != b'"' {
            if s[i] == b'\\' {
                i += 1;
            }
            i += 1;
        }
        self.pos = i.min(s.len());
        unpaired_surrogate()
    }

    fn hex4(&self, at: usize) -> Result<u32> {
        let h = self.s.get(at..at + 4).ok_or_else(|| self.syntax("invalid \\u escape"))?;
        let mut v = 0u32;
        for &c in h {
            let d = (c as char).to_digit(16).ok_or_else(|| self.syntax("invalid \\u escape"))?;
            v = v * 16 + d;
        }
        Ok(v)
    }

    /// A whole value as a tree (dynamic values and type specs).
    pub fn value(&mut self, depth: usize) -> Result<JVal> {
        match self.peek_kind()? {
            Kind::Null => {
                self.literal(b"null")?;
                Ok(JVal::Null)
            }
            Kind::Bool => Ok(JVal::Bool(self.parse_bool()?)),
            Kind::Number => Ok(JVal::Num(self.checked_number_text()?.to_vec())),
            Kind::String => Ok(JVal::Str(self.string()?.into_owned())),
            Kind::Array => {
                if depth >= JSON_NESTING_LIMIT {
                    return Err(PathError::invalid_json("nesting too deep"));
                }
                self.bump();
                let mut items = Vec::new();
                if !self.empty_close(b']') {
                    loop {
                        items.push(self.value(depth + 1)?);
                        if !self.next_or_close(b']')? {
                            break;
                        }
                    }
                }
                Ok(JVal::Arr(items))
            }
            Kind::Object => {
                if depth >= JSON_NESTING_LIMIT {
                    return Err(PathError::invalid_json("nesting too deep"));
                }
                self.bump();
                let mut members = Vec::new();
                if !self.empty_close(b'}') {
                    loop {
                        let k = self.key()?.into_owned();
                        members.push((k, self.value(depth + 1)?));
                        if !self.next_or_close(b'}')? {
                            break;
                        }
                    }
                }
                Ok(JVal::Obj(members))
            }
        }
    }

    /// Skip a value, checking its syntax (used to count a tuple's elements before encoding).
    pub fn skip_value(&mut self, depth: usize) -> Result<()> {
        match self.peek_kind()? {
            Kind::Null => self.literal(b"null"),
            Kind::Bool => self.parse_bool().map(|_| ()),
            Kind::Number => self.checked_number_text().map(|_| ()),
            Kind::String => self.string().map(|_| ()),
            Kind::Array | Kind::Object => {
                if depth >= JSON_NESTING_LIMIT {
                    return Err(PathError::invalid_json("nesting too deep"));
                }
                let close = if self.s[self.pos] == b'[' { b']' } else { b'}' };
                self.bump();
                if !self.empty_close(close) {
                    loop {
                        if close == b'}' {
                            self.key()?;
                        }
                        self.skip_value(depth + 1)?;
                        if !self.next_or_close(close)? {
                            break;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Parse a complete JSON document into a tree.
pub fn parse_document(data: &[u8]) -> Result<JVal> {
    let mut p = Parser::new(data)?;
    let v = p.value(0)?;
    p.finish()?;
    Ok(v)
}

/// A JSON string literal as Python's `json.encoder.encode_basestring` writes it: UTF-8 kept,
/// only `"`, `\` and C0 controls escaped (short forms where JSON has them, else `\u00xx`),
/// which is what serde_json's compact writer does, byte for byte.
#[inline]
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    let written = serde_json::to_writer(&mut *out, s);
    debug_assert!(written.is_ok(), "a Vec takes every write");
}

pub fn quote(s: &str) -> String {
    let mut v = Vec::new();
    write_json_string(&mut v, s);
    String::from_utf8(v).expect("UTF-8 in, UTF-8 out")
}

/// A tree back to JSON text (numbers keep their original spelling).
pub fn write_jval(out: &mut Vec<u8>, v: &JVal) {
    write_jval_numbers(out, v, &|out, text| out.extend_from_slice(text));
}

/// A tree back to JSON text, each number written by WRITE_NUMBER from its original spelling.
pub fn write_jval_numbers(out: &mut Vec<u8>, v: &JVal, write_number: &dyn Fn(&mut Vec<u8>, &[u8])) {
    match v {
        JVal::Null => out.extend_from_slice(b"null"),
        JVal::Bool(true) => out.extend_from_slice(b"true"),
        JVal::Bool(false) => out.extend_from_slice(b"false"),
        JVal::Num(t) => write_number(out, t),
        JVal::Str(s) => write_json_string(out, s),
        JVal::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_jval_numbers(out, item, write_number);
            }
            out.push(b']');
        }
        JVal::Obj(members) => {
            out.push(b'{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_string(out, k);
                out.push(b':');
                write_jval_numbers(out, item, write_number);
            }
            out.push(b'}');
        }
    }
}

/// Unicode Normalization Form C, as `cty.StringVal` applies to every string and map key (twin of
/// `nfc` in jsontext.py; the crate's tables are Unicode 18.0, see README "Values: what Terraform would write").
pub fn nfc(s: Cow<'_, str>) -> Cow<'_, str> {
    if s.is_ascii() || is_nfc_quick(s.chars()) == IsNormalized::Yes {
        return s;
    }
    Cow::Owned(s.nfc().collect())
}
