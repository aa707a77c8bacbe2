//! msgpack primitives (twin of kilolock/codec/pure/mp.py): the writer (most compact forms, as
//! vmihailenco/msgpack's Encode* that go-cty calls) and a bounds-checked reader that never trusts
//! a declared length.

use crate::errors::{PathError, Result};
use crate::jsontext::nfc;
use std::borrow::Cow;

#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 0x100 {
        out.push(0xd9);
        out.push(n as u8);
    } else if n < 0x10000 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

pub fn write_bin(out: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    if n < 0x100 {
        out.push(0xc4);
        out.push(n as u8);
    } else if n < 0x10000 {
        out.push(0xc5);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

fn header_len(n: usize) -> usize {
    if n < 16 {
        1
    } else if n < 0x10000 {
        3
    } else {
        5
    }
}

fn write_header(buf: &mut [u8], n: usize, fix: u8, m16: u8, m32: u8) {
    if n < 16 {
        buf[0] = fix | n as u8;
    } else if n < 0x10000 {
        buf[0] = m16;
        buf[1..3].copy_from_slice(&(n as u16).to_be_bytes());
    } else {
        buf[0] = m32;
        buf[1..5].copy_from_slice(&(n as u32).to_be_bytes());
    }
}

#[inline]
pub fn write_array_header(out: &mut Vec<u8>, n: usize) {
    let at = out.len();
    out.resize(at + header_len(n), 0);
    write_header(&mut out[at..], n, 0x90, 0xdc, 0xdd);
}

#[inline]
pub fn write_map_header(out: &mut Vec<u8>, n: usize) {
    let at = out.len();
    out.resize(at + header_len(n), 0);
    write_header(&mut out[at..], n, 0x80, 0xde, 0xdf);
}

/// Put a header for `n` items in front of the content written since `start` (the count is only
/// known once the JSON container is closed). Most containers are small: one byte, one shift.
pub fn insert_header(out: &mut Vec<u8>, start: usize, n: usize, is_map: bool) {
    let hl = header_len(n);
    let content_len = out.len() - start;
    out.resize(out.len() + hl, 0);
    out.copy_within(start..start + content_len, start + hl);
    if is_map {
        write_header(&mut out[start..], n, 0x80, 0xde, 0xdf);
    } else {
        write_header(&mut out[start..], n, 0x90, 0xdc, 0xdd);
    }
}

#[inline]
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        let u = v as u64;
        if u < 0x80 {
            out.push(u as u8);
        } else if u < 0x100 {
            out.push(0xcc);
            out.push(u as u8);
        } else if u < 0x10000 {
            out.push(0xcd);
            out.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u < 0x1_0000_0000 {
            out.push(0xce);
            out.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= -0x80 {
        out.push(0xd0);
        out.push(v as i8 as u8);
    } else if v >= -0x8000 {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= -0x8000_0000 {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[inline]
pub fn write_f64(out: &mut Vec<u8>, f: f64) {
    out.push(0xcb);
    out.extend_from_slice(&f.to_bits().to_be_bytes());
}

/// The family of the next item, with its scalar value or its declared length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Head {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(usize),
    Bin(usize),
    Array(usize),
    Map(usize),
    Ext,
}

impl Head {
    pub fn family(&self) -> &'static str {
        match self {
            Head::Nil => "nil",
            Head::Bool(_) => "bool",
            Head::Int(_) => "int",
            Head::Float(_) => "float",
            Head::Str(_) => "str",
            Head::Bin(_) => "bin",
            Head::Array(_) => "array",
            Head::Map(_) => "map",
            Head::Ext => "ext",
        }
    }
}

pub struct Reader<'a> {
    pub data: &'a [u8],
    pub pos: usize,
}

fn truncated(pos: usize) -> PathError {
    PathError::new(format!("truncated msgpack at offset {}", pos))
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let pos = self.pos;
        if n > self.data.len() - pos {
            return Err(truncated(pos));
        }
        self.pos = pos + n;
        Ok(&self.data[pos..pos + n])
    }

    #[inline]
    fn uint(&mut self, n: usize) -> Result<u64> {
        let b = self.take(n)?;
        Ok(b.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    #[inline]
    pub fn head(&mut self) -> Result<Head> {
        let pos = self.pos;
        let b = *self.data.get(pos).ok_or_else(|| truncated(pos))?;
        self.pos = pos + 1;
        Ok(match b {
            0x00..=0x7f => Head::Int(b as i128),
            0xe0..=0xff => Head::Int(b as i8 as i128),
            0xa0..=0xbf => Head::Str((b & 0x1f) as usize),
            0x90..=0x9f => Head::Array((b & 0x0f) as usize),
            0x80..=0x8f => Head::Map((b & 0x0f) as usize),
            0xc0 => Head::Nil,
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xcc => Head::Int(self.uint(1)? as i128),
            0xcd => Head::Int(self.uint(2)? as i128),
            0xce => Head::Int(self.uint(4)? as i128),
            0xcf => Head::Int(self.uint(8)? as i128),
            0xd0 => Head::Int(self.uint(1)? as u8 as i8 as i128),
            0xd1 => Head::Int(self.uint(2)? as u16 as i16 as i128),
            0xd2 => Head::Int(self.uint(4)? as u32 as i32 as i128),
            0xd3 => Head::Int(self.uint(8)? as i64 as i128),
            0xca => Head::Float(f32::from_bits(self.uint(4)? as u32) as f64),
            0xcb => Head::Float(f64::from_bits(self.uint(8)?)),
            0xd9 => Head::Str(self.uint(1)? as usize),
            0xda => Head::Str(self.uint(2)? as usize),
            0xdb => Head::Str(self.uint(4)? as usize),
            0xc4 => Head::Bin(self.uint(1)? as usize),
            0xc5 => Head::Bin(self.uint(2)? as usize),
            0xc6 => Head::Bin(self.uint(4)? as usize),
            0xdc => Head::Array(self.uint(2)? as usize),
            0xdd => Head::Array(self.uint(4)? as usize),
            0xde => Head::Map(self.uint(2)? as usize),
            0xdf => Head::Map(self.uint(4)? as usize),
            0xd4..=0xd8 | 0xc7..=0xc9 => Head::Ext, // unknown value (ext 0, refined ext 12, any code)
            _ => return Err(PathError::new(format!("invalid msgpack byte 0x{:02x} at offset {}", b, pos))),
        })
    }

    /// A string as go-cty and Terraform store it (twin of `decode_text` in mp.py): invalid UTF-8
    /// replaced byte by byte, then NFC.
    pub fn text(&mut self, n: usize) -> Result<Cow<'a, str>> {
        let b = self.take(n)?;
        let s = match std::str::from_utf8(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(replace_per_byte(b)),
        };
        Ok(nfc(s))
    }
}

/// Every byte that is not part of valid UTF-8 as its own U+FFFD, as Go's encoding/json writes a
/// string into state (Rust's `from_utf8_lossy` would put one U+FFFD per maximal ill-formed run).
fn replace_per_byte(mut b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 8);
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&b[..valid]).expect("checked valid"));
                let bad = e.error_len().unwrap_or(b.len() - valid);
                for _ in 0..bad {
                    out.push('\u{fffd}');
                }
                b = &b[valid + bad..];
            }
        }
    }
}
