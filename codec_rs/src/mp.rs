//! msgpack primitives (twin of kilolock/codec/pure/mp.py) on the `rmp` crate: its writers pick
//! the most compact form, as vmihailenco/msgpack's Encode* that go-cty calls do, and its markers
//! drive a bounds-checked reader that never trusts a declared length. The codec walks the value
//! with its cty type in hand (an object's absent attributes go out as nil, sets in cty's order),
//! so it calls these primitives rather than serializing a tree.

use crate::errors::{PathError, Result};
use crate::jsontext::nfc;
use rmp::decode::{Bytes, RmpRead};
use rmp::{encode, Marker};
use std::borrow::Cow;

/// rmp writes through `std::io::Write`, and a `Vec` takes every write: there is no error to pass on.
#[inline(always)]
fn infallible<T, E: std::fmt::Debug>(r: std::result::Result<T, E>) {
    debug_assert!(r.is_ok(), "{:?}", r.err());
}

#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    infallible(encode::write_str_len(out, s.len() as u32));
    out.extend_from_slice(s);
}

pub fn write_bin(out: &mut Vec<u8>, s: &[u8]) {
    infallible(encode::write_bin_len(out, s.len() as u32));
    out.extend_from_slice(s);
}

#[inline]
pub fn write_array_header(out: &mut Vec<u8>, n: usize) {
    infallible(encode::write_array_len(out, n as u32));
}

#[inline]
pub fn write_map_header(out: &mut Vec<u8>, n: usize) {
    infallible(encode::write_map_len(out, n as u32));
}

/// Put a header for `n` items in front of the content written since `start` (the count is only
/// known once the JSON container is closed). Most containers are small: one byte, one shift.
pub fn insert_header(out: &mut Vec<u8>, start: usize, n: usize, is_map: bool) {
    let mut header = [0u8; 5];
    let unused = {
        let mut w: &mut [u8] = &mut header;
        if is_map {
            infallible(encode::write_map_len(&mut w, n as u32));
        } else {
            infallible(encode::write_array_len(&mut w, n as u32));
        }
        w.len()
    };
    let hl = header.len() - unused;
    let content_len = out.len() - start;
    out.resize(out.len() + hl, 0);
    out.copy_within(start..start + content_len, start + hl);
    out[start..start + hl].copy_from_slice(&header[..hl]);
}

#[inline]
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    infallible(encode::write_sint(out, v));
}

#[inline]
pub fn write_f64(out: &mut Vec<u8>, f: f64) {
    infallible(encode::write_f64(out, f));
}

#[inline]
pub fn write_nil(out: &mut Vec<u8>) {
    infallible(encode::write_nil(out));
}

#[inline]
pub fn write_bool(out: &mut Vec<u8>, b: bool) {
    infallible(encode::write_bool(out, b));
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
    pub fn head(&mut self) -> Result<Head> {
        let pos = self.pos;
        let mut rd = Bytes::new(&self.data[pos..]);
        let marker = rmp::decode::read_marker(&mut rd).map_err(|_| truncated(pos))?;
        let head = match marker {
            Marker::FixPos(v) => Ok(Head::Int(v as i128)),
            Marker::FixNeg(v) => Ok(Head::Int(v as i128)),
            Marker::FixStr(n) => Ok(Head::Str(n as usize)),
            Marker::FixArray(n) => Ok(Head::Array(n as usize)),
            Marker::FixMap(n) => Ok(Head::Map(n as usize)),
            Marker::Null => Ok(Head::Nil),
            Marker::False => Ok(Head::Bool(false)),
            Marker::True => Ok(Head::Bool(true)),
            Marker::U8 => rd.read_data_u8().map(|v| Head::Int(v as i128)),
            Marker::U16 => rd.read_data_u16().map(|v| Head::Int(v as i128)),
            Marker::U32 => rd.read_data_u32().map(|v| Head::Int(v as i128)),
            Marker::U64 => rd.read_data_u64().map(|v| Head::Int(v as i128)),
            Marker::I8 => rd.read_data_i8().map(|v| Head::Int(v as i128)),
            Marker::I16 => rd.read_data_i16().map(|v| Head::Int(v as i128)),
            Marker::I32 => rd.read_data_i32().map(|v| Head::Int(v as i128)),
            Marker::I64 => rd.read_data_i64().map(|v| Head::Int(v as i128)),
            Marker::F32 => rd.read_data_f32().map(|f| Head::Float(f as f64)),
            Marker::F64 => rd.read_data_f64().map(Head::Float),
            Marker::Str8 => rd.read_data_u8().map(|n| Head::Str(n as usize)),
            Marker::Str16 => rd.read_data_u16().map(|n| Head::Str(n as usize)),
            Marker::Str32 => rd.read_data_u32().map(|n| Head::Str(n as usize)),
            Marker::Bin8 => rd.read_data_u8().map(|n| Head::Bin(n as usize)),
            Marker::Bin16 => rd.read_data_u16().map(|n| Head::Bin(n as usize)),
            Marker::Bin32 => rd.read_data_u32().map(|n| Head::Bin(n as usize)),
            Marker::Array16 => rd.read_data_u16().map(|n| Head::Array(n as usize)),
            Marker::Array32 => rd.read_data_u32().map(|n| Head::Array(n as usize)),
            Marker::Map16 => rd.read_data_u16().map(|n| Head::Map(n as usize)),
            Marker::Map32 => rd.read_data_u32().map(|n| Head::Map(n as usize)),
            // An unknown value (ext 0, refined ext 12, any code): its payload is never read.
            Marker::FixExt1 | Marker::FixExt2 | Marker::FixExt4 | Marker::FixExt8 | Marker::FixExt16 => Ok(Head::Ext),
            Marker::Ext8 | Marker::Ext16 | Marker::Ext32 => Ok(Head::Ext),
            Marker::Reserved => {
                return Err(PathError::new(format!("invalid msgpack byte 0x{:02x} at offset {}", self.data[pos], pos)))
            }
        };
        // Only the data after the marker can run short.
        let head = head.map_err(|_| truncated(pos + 1))?;
        self.pos = pos + rd.position() as usize;
        Ok(head)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    /// Each form's first and last size, as vmihailenco/msgpack writes them for go-cty: the
    /// boundaries the rmp writers must pick exactly as the hand-written ones did.
    #[test]
    fn writers_pick_the_most_compact_form_at_every_boundary() {
        let ints: &[(i64, &[u8])] = &[
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0xcc, 0x80]),
            (255, &[0xcc, 0xff]),
            (256, &[0xcd, 0x01, 0x00]),
            (65535, &[0xcd, 0xff, 0xff]),
            (65536, &[0xce, 0x00, 0x01, 0x00, 0x00]),
            (4294967295, &[0xce, 0xff, 0xff, 0xff, 0xff]),
            (4294967296, &[0xcf, 0, 0, 0, 1, 0, 0, 0, 0]),
            (-1, &[0xff]),
            (-32, &[0xe0]),
            (-33, &[0xd0, 0xdf]),
            (-128, &[0xd0, 0x80]),
            (-129, &[0xd1, 0xff, 0x7f]),
            (-32768, &[0xd1, 0x80, 0x00]),
            (-32769, &[0xd2, 0xff, 0xff, 0x7f, 0xff]),
            (-2147483648, &[0xd2, 0x80, 0, 0, 0]),
            (-2147483649, &[0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]),
        ];
        for &(v, want) in ints {
            assert_eq!(bytes(|o| write_int(o, v)), want, "{}", v);
        }
        for (n, head) in [(31, vec![0xbf]), (32, vec![0xd9, 32]), (255, vec![0xd9, 255]), (256, vec![0xda, 1, 0]), (65536, vec![0xdb, 0, 1, 0, 0])] {
            assert_eq!(bytes(|o| write_str(o, &vec![b'x'; n]))[..head.len()], head[..], "str {}", n);
        }
        for (n, head) in [(0, vec![0xc4, 0]), (255, vec![0xc4, 255]), (256, vec![0xc5, 1, 0]), (65536, vec![0xc6, 0, 1, 0, 0])] {
            assert_eq!(bytes(|o| write_bin(o, &vec![0; n]))[..head.len()], head[..], "bin {}", n);
        }
        for (n, array, map) in [
            (15, vec![0x9f], vec![0x8f]),
            (16, vec![0xdc, 0, 16], vec![0xde, 0, 16]),
            (65535, vec![0xdc, 0xff, 0xff], vec![0xde, 0xff, 0xff]),
            (65536, vec![0xdd, 0, 1, 0, 0], vec![0xdf, 0, 1, 0, 0]),
        ] {
            assert_eq!(bytes(|o| write_array_header(o, n)), array, "array {}", n);
            assert_eq!(bytes(|o| write_map_header(o, n)), map, "map {}", n);
            let mut out = b"ab".to_vec();
            insert_header(&mut out, 1, n, true);
            assert_eq!(out, [&b"a"[..], &map, b"b"].concat(), "inserted map {}", n);
        }
        assert_eq!(bytes(|o| write_f64(o, 0.5)), [0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(|o| { write_nil(o); write_bool(o, false); write_bool(o, true) }), [0xc0, 0xc2, 0xc3]);
    }

    #[test]
    fn reader_reads_every_form_back_and_names_where_it_stops() {
        let mut wire = Vec::new();
        for v in [0, 127, 128, 65536, 4294967296, -1, -33, -129, -32769, -2147483649] {
            write_int(&mut wire, v);
        }
        write_f64(&mut wire, -2.5);
        wire.extend_from_slice(&[0xca, 0x3f, 0xc0, 0, 0]); // float32 1.5
        write_str(&mut wire, &[b's'; 40]);
        write_bin(&mut wire, b"{}");
        write_array_header(&mut wire, 70000);
        write_map_header(&mut wire, 3);
        wire.extend_from_slice(&[0xd4, 0, 0, 0xc0, 0xc3]); // fixext1 (an unknown value), nil, true
        let mut r = Reader::new(&wire);
        let mut heads = Vec::new();
        while r.pos < wire.len() {
            let h = r.head().unwrap();
            match h {
                Head::Str(n) | Head::Bin(n) => {
                    r.take(n).unwrap();
                }
                Head::Ext => r.pos += 2,
                _ => {}
            }
            heads.push(h);
        }
        let ints = [0, 127, 128, 65536, 4294967296, -1, -33, -129, -32769, -2147483649].map(Head::Int);
        let rest = [Head::Float(-2.5), Head::Float(1.5), Head::Str(40), Head::Bin(2), Head::Array(70000), Head::Map(3), Head::Ext, Head::Nil, Head::Bool(true)];
        assert_eq!(heads, [&ints[..], &rest[..]].concat());

        let err = |data: &[u8]| Reader::new(data).head().unwrap_err().message;
        assert_eq!(err(&[]), "truncated msgpack at offset 0");
        assert_eq!(err(&[0xcd, 0x01]), "truncated msgpack at offset 1");
        assert_eq!(err(&[0xdb, 0, 0]), "truncated msgpack at offset 1");
        assert_eq!(err(&[0xc1]), "invalid msgpack byte 0xc1 at offset 0");
    }
}
