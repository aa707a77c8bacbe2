//! unmarshal: msgpack -> canonical cty JSON (sorted keys, compact, exact numbers, dynamic values
//! as `{"type":..,"value":..}`); twin of the `unmarshal*` functions in kilolock/codec/pure.py.

use crate::error::{too_deep, AtStep, CodecErr, Result, MAX_DEPTH};
use crate::json::write_json_string;
use crate::mp::{Head, Reader};
use crate::number::{canonical_text, cmp_dec, float_text, from_i128, parse_number, Dec};
use crate::types::{parse_type, start_reordering, ObjectTy, Ty};
use std::cmp::Ordering;
use std::collections::HashSet;

const UNKNOWN: &str = "unknown value: a refreshed state must be wholly known";

/// Decode a whole msgpack value.
pub fn decode(data: &[u8], ty: &Ty) -> Result<Vec<u8>> {
    let mut r = Reader::new(data);
    let mut out = Vec::with_capacity(data.len() * 2 + 16);
    unmarshal(&mut r, ty, &mut out, 0)?;
    if r.pos != data.len() {
        return Err(CodecErr::new(format!("trailing bytes after the msgpack value at offset {}", r.pos)));
    }
    Ok(out)
}

fn got(what: &str, head: Head) -> CodecErr {
    if head == Head::Ext {
        return CodecErr::new(UNKNOWN);
    }
    CodecErr::new(format!("expected {}, got msgpack {}", what, head.family()))
}

pub fn unmarshal(r: &mut Reader, ty: &Ty, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let head = r.head()?;
    if head == Head::Nil {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match ty {
        Ty::String => unmarshal_string(r, head, out),
        Ty::Number => {
            let d = read_number(r, head)?;
            write_number(&d, out);
            Ok(())
        }
        Ty::Bool => match head {
            Head::Bool(b) => {
                out.extend_from_slice(if b { b"true" } else { b"false" });
                Ok(())
            }
            _ => Err(got("bool", head)),
        },
        Ty::List(elem) => unmarshal_list(r, head, elem, out, depth),
        Ty::Set(elem) => unmarshal_set(r, head, elem, out, depth),
        Ty::Tuple(elems) => unmarshal_tuple(r, head, elems, out, depth),
        Ty::Map(elem) => unmarshal_map(r, head, elem, out, depth),
        Ty::Object(o) => unmarshal_object(r, head, o, out, depth),
        Ty::Dynamic => unmarshal_dynamic(r, head, out, depth),
    }
}

fn unmarshal_string(r: &mut Reader, head: Head, out: &mut Vec<u8>) -> Result<()> {
    match head {
        Head::Str(n) => {
            let s = r.text(n)?;
            write_json_string(out, s.as_bytes());
            Ok(())
        }
        _ => Err(got("string", head)),
    }
}

/// Numbers arrive as any int, float32/64, or decimal text (go-cty's three wire forms).
fn read_number(r: &mut Reader, head: Head) -> Result<Dec> {
    match head {
        Head::Int(v) => Ok(from_i128(v)),
        Head::Float(f) => {
            let mut text = Vec::new();
            float_text(f, &mut text).map_err(CodecErr::new)?;
            Ok(parse_number(&text).expect("canonical text parses"))
        }
        Head::Str(n) => {
            let s = r.text(n)?;
            parse_number(s.as_bytes()).map_err(|e| CodecErr::new(format!("invalid number string: {}", e)))
        }
        _ => Err(got("number", head)),
    }
}

fn write_number(d: &Dec, out: &mut Vec<u8>) {
    canonical_text(d, out);
}

fn array_len(head: Head, what: &str, depth: usize) -> Result<usize> {
    match head {
        Head::Array(n) => {
            if depth >= MAX_DEPTH {
                return Err(too_deep());
            }
            Ok(n)
        }
        _ => Err(got(what, head)),
    }
}

fn unmarshal_list(r: &mut Reader, head: Head, elem: &Ty, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "list", depth)?;
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        unmarshal(r, elem, out, depth + 1).at(|| format!("[{}]", i))?;
    }
    out.push(b']');
    Ok(())
}

fn unmarshal_set(r: &mut Reader, head: Head, elem: &Ty, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "set", depth)?;
    out.push(b'[');
    if elem.is_primitive() {
        // Sorted and deduplicated like cty's own set, whatever order the sender used.
        let mut strings: Vec<&str> = Vec::new();
        let mut numbers: Vec<Dec> = Vec::new();
        let mut bools = [false, false];
        let mut has_null = false;
        for i in 0..n {
            let r2: Result<()> = (|| {
                let h = r.head()?;
                if h == Head::Nil {
                    has_null = true;
                    return Ok(());
                }
                match elem {
                    Ty::String => match h {
                        Head::Str(len) => strings.push(r.text(len)?),
                        _ => return Err(got("string", h)),
                    },
                    Ty::Number => numbers.push(read_number(r, h)?),
                    _ => match h {
                        Head::Bool(b) => bools[b as usize] = true,
                        _ => return Err(got("bool", h)),
                    },
                }
                Ok(())
            })();
            r2.at(|| format!("[{}]", i))?;
        }
        strings.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        strings.dedup();
        numbers.sort_by(cmp_dec);
        numbers.dedup_by(|a, b| cmp_dec(a, b) == Ordering::Equal);
        let mut first = true;
        let mut sep = |out: &mut Vec<u8>| {
            if !first {
                out.push(b',');
            }
            first = false;
        };
        for s in strings {
            sep(out);
            write_json_string(out, s.as_bytes());
        }
        for d in &numbers {
            sep(out);
            write_number(d, out);
        }
        if bools[0] {
            sep(out);
            out.extend_from_slice(b"false");
        }
        if bools[1] {
            sep(out);
            out.extend_from_slice(b"true");
        }
        if has_null {
            sep(out);
            out.extend_from_slice(b"null");
        }
    } else {
        // A set is the same value in any order: its JSON lists the elements sorted by their
        // canonical text, so a provider's order never shows up as drift.
        let mut texts: Vec<Vec<u8>> = Vec::new();
        for i in 0..n {
            let mut text = Vec::new();
            unmarshal(r, elem, &mut text, depth + 1).at(|| format!("[{}]", i))?;
            texts.push(text);
        }
        texts.sort_unstable();
        texts.dedup();
        for (i, text) in texts.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(text);
        }
    }
    out.push(b']');
    Ok(())
}

fn unmarshal_tuple(r: &mut Reader, head: Head, elems: &[Ty], out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "tuple", depth)?;
    if n != elems.len() {
        return Err(CodecErr::new(format!("expected tuple of {} elements, got {}", elems.len(), n)));
    }
    out.push(b'[');
    for (i, elem) in elems.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        unmarshal(r, elem, out, depth + 1).at(|| format!("[{}]", i))?;
    }
    out.push(b']');
    Ok(())
}

fn map_len(head: Head, what: &str, depth: usize) -> Result<usize> {
    match head {
        Head::Map(n) => {
            if depth >= MAX_DEPTH {
                return Err(too_deep());
            }
            Ok(n)
        }
        _ => Err(got(what, head)),
    }
}

fn map_key<'a>(r: &mut Reader<'a>) -> Result<&'a str> {
    match r.head()? {
        Head::Str(n) => r.text(n),
        h => Err(got("string map key", h)),
    }
}

fn unmarshal_map(r: &mut Reader, head: Head, elem: &Ty, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = map_len(head, "map", depth)?;
    let start = out.len();
    out.push(b'{');
    // (key, value span); written in wire order, reordered at the end only if it was unsorted.
    let mut entries: Vec<(&str, usize, usize)> = Vec::new();
    let mut keyset: Option<HashSet<&str>> = None;
    let mut sorted = true;
    for _ in 0..n {
        let key = map_key(r)?;
        let duplicate = match (&mut keyset, entries.last()) {
            (Some(set), _) => !set.insert(key),
            (None, Some(&(last, _, _))) => match key.as_bytes().cmp(last.as_bytes()) {
                Ordering::Greater => false,
                Ordering::Equal => true,
                Ordering::Less => {
                    sorted = false;
                    let mut set: HashSet<&str> = entries.iter().map(|e| e.0).collect();
                    let dup = !set.insert(key);
                    keyset = Some(set);
                    dup
                }
            },
            (None, None) => false,
        };
        if duplicate {
            return Err(CodecErr::new(format!("duplicate key {}", crate::json::quote(key))));
        }
        if !entries.is_empty() {
            out.push(b',');
        }
        write_json_string(out, key.as_bytes());
        out.push(b':');
        let s = out.len();
        unmarshal(r, elem, out, depth + 1).at(|| format!("[{}]", crate::json::quote(key)))?;
        entries.push((key, s, out.len()));
    }
    if !sorted {
        let written = out.split_off(start);
        entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        out.push(b'{');
        for (i, (key, s, e)) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_string(out, key.as_bytes());
            out.push(b':');
            out.extend_from_slice(&written[s - start..e - start]);
        }
    }
    out.push(b'}');
    Ok(())
}

fn unmarshal_object(r: &mut Reader, head: Head, o: &ObjectTy, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n_wire = map_len(head, "object", depth)?;
    let n = o.names.len();
    out.push(b'{');
    let region = out.len();
    let mut seen = vec![false; 0];
    let mut seen_small: u128 = 0;
    if n > 128 {
        seen = vec![false; n];
    }
    let mut next = 0usize; // in order so far: attributes [0, next) are written
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut reordered: Option<(Vec<u8>, Vec<Option<(usize, usize)>>)> = None;
    for _ in 0..n_wire {
        let key = map_key(r)?;
        let idx = o
            .lookup(key)
            .ok_or_else(|| CodecErr::new(format!("unknown attribute {}", crate::json::quote(key))))?;
        let dup = if n > 128 {
            std::mem::replace(&mut seen[idx], true)
        } else {
            let bit = 1u128 << idx;
            let was = seen_small & bit != 0;
            seen_small |= bit;
            was
        };
        if dup {
            return Err(CodecErr::new(format!("duplicate key {}", crate::json::quote(key))));
        }
        let ty = &o.types[idx];
        match reordered.as_mut() {
            None if idx >= next => {
                for j in next..idx {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(&o.json_keys[j]);
                    spans.push((out.len(), out.len() + 4));
                    out.extend_from_slice(b"null");
                }
                if idx > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json_keys[idx]);
                let s = out.len();
                unmarshal(r, ty, out, depth + 1).at(|| format!(".{}", o.names[idx]))?;
                spans.push((s, out.len()));
                next = idx + 1;
            }
            _ => {
                let (temp, ranges) = reordered.get_or_insert_with(|| start_reordering(out, region, &spans, n));
                let s = temp.len();
                unmarshal(r, ty, temp, depth + 1).at(|| format!(".{}", o.names[idx]))?;
                ranges[idx] = Some((s, temp.len()));
            }
        }
    }
    // Attributes missing on the wire decode as null, like absent ones in cty JSON.
    match reordered {
        None => {
            for j in next..n {
                if j > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json_keys[j]);
                out.extend_from_slice(b"null");
            }
        }
        Some((temp, ranges)) => {
            for j in 0..n {
                if j > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json_keys[j]);
                match ranges[j] {
                    Some((s, e)) => out.extend_from_slice(&temp[s..e]),
                    None => out.extend_from_slice(b"null"),
                }
            }
        }
    }
    out.push(b'}');
    Ok(())
}

fn unmarshal_dynamic(r: &mut Reader, head: Head, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    match head {
        Head::Array(2) => {}
        Head::Ext => return Err(CodecErr::new(UNKNOWN)),
        _ => return Err(CodecErr::new("expected a [type, value] pair for a dynamic value")),
    }
    let type_json = match r.head()? {
        Head::Str(n) | Head::Bin(n) => r.take(n)?,
        h => return Err(got("type JSON (bin)", h)),
    };
    let concrete = parse_type(type_json).map_err(|mut e| {
        e.at_root = false; // a bad type inside the value is reported where it sits
        e
    })?;
    if matches!(concrete, Ty::Dynamic) {
        return Err(CodecErr::new("a dynamic value needs a concrete type, not \"dynamic\""));
    }
    out.extend_from_slice(b"{\"type\":");
    concrete.write_json(out);
    out.extend_from_slice(b",\"value\":");
    unmarshal(r, &concrete, out, depth)?;
    out.push(b'}');
    Ok(())
}
