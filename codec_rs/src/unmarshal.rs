//! unmarshal: msgpack -> canonical cty JSON (sorted keys, compact, exact numbers, dynamic values
//! as `{"type":..,"value":..}`); twin of kilolock/codec/pure/unmarshal.py.

use crate::errors::{too_deep, AtStep, PathError, Result, Step, MAX_DEPTH};
use crate::jsontext::{quote, write_json_string};
use crate::mp::{Head, Reader};
use crate::numbers::{canonical_text, cmp_dec, float_text, from_i128, parse_number, Dec};
use crate::order::{AttrSet, MapEntries, Reordered, Span};
use crate::jsontext::parse_document;
use crate::types::{as_gocty_json, parse_type, CtyType, ElementTypes, ObjectType};
use std::borrow::Cow;
use std::cmp::Ordering;

const UNKNOWN: &str = "unknown value: a refreshed state must be wholly known";

/// Decode a whole msgpack value.
pub fn decode(data: &[u8], ty: &CtyType) -> Result<Vec<u8>> {
    let mut r = Reader::new(data);
    let mut out = Vec::with_capacity(data.len() * 2 + 16);
    unmarshal(&mut r, ty, &mut out, 0)?;
    if r.pos != data.len() {
        return Err(PathError::new(format!("trailing bytes after the msgpack value at offset {}", r.pos)));
    }
    if ty.has_dynamic_collection() {
        // A null dynamic element takes its collection's element type (as_gocty_json); values
        // tagged with a type that has dynamic in it were retyped where they are.
        return as_gocty_json(&parse_document(&out)?, ty, false);
    }
    Ok(out)
}

fn got(what: &str, head: Head) -> PathError {
    if head == Head::Ext {
        return PathError::new(UNKNOWN);
    }
    PathError::new(format!("expected {}, got msgpack {}", what, head.family()))
}

pub fn unmarshal(r: &mut Reader, ty: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let head = r.head()?;
    if head == Head::Nil {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match ty {
        CtyType::String => unmarshal_string(r, head, out),
        CtyType::Number => unmarshal_number(r, head, out),
        CtyType::Bool => unmarshal_bool(head, out),
        CtyType::List(elem) => unmarshal_list(r, head, elem, out, depth),
        CtyType::Set(elem) => unmarshal_set(r, head, elem, out, depth),
        CtyType::Tuple(elems) => unmarshal_tuple(r, head, elems, out, depth),
        CtyType::Map(elem) => unmarshal_map(r, head, elem, out, depth),
        CtyType::Object(o) => unmarshal_object(r, head, o, out, depth),
        CtyType::Dynamic => unmarshal_dynamic(r, head, out, depth),
    }
}

fn unmarshal_string(r: &mut Reader, head: Head, out: &mut Vec<u8>) -> Result<()> {
    match head {
        Head::Str(n) => {
            let s = r.text(n)?;
            write_json_string(out, &s);
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
            float_text(f, &mut text).map_err(PathError::new)?;
            parse_number(&text).map_err(PathError::new)
        }
        Head::Str(n) => {
            let s = r.text(n)?;
            parse_number(s.as_bytes()).map_err(|e| PathError::new(format!("invalid number string: {}", e)))
        }
        _ => Err(got("number", head)),
    }
}

fn write_number(d: &Dec, out: &mut Vec<u8>) {
    canonical_text(d, out);
}

fn unmarshal_number(r: &mut Reader, head: Head, out: &mut Vec<u8>) -> Result<()> {
    write_number(&read_number(r, head)?, out);
    Ok(())
}

fn unmarshal_bool(head: Head, out: &mut Vec<u8>) -> Result<()> {
    match head {
        Head::Bool(b) => {
            out.extend_from_slice(if b { b"true" } else { b"false" });
            Ok(())
        }
        _ => Err(got("bool", head)),
    }
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

fn unmarshal_list(r: &mut Reader, head: Head, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "list", depth)?;
    let mut typed = ElementTypes::new(elem);
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        let from = out.len();
        unmarshal(r, elem, out, depth + 1).at(|| Step::Index(i))?;
        typed.note(Step::Index(i), &out[from..])?;
    }
    typed.check(elem, "list")?;
    out.push(b']');
    Ok(())
}

fn unmarshal_set(r: &mut Reader, head: Head, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "set", depth)?;
    out.push(b'[');
    if elem.is_primitive() {
        // Sorted and deduplicated like cty's own set, whatever order the sender used.
        let mut strings: Vec<Cow<str>> = Vec::new();
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
                    CtyType::String => match h {
                        Head::Str(len) => strings.push(r.text(len)?),
                        _ => return Err(got("string", h)),
                    },
                    CtyType::Number => numbers.push(read_number(r, h)?),
                    _ => match h {
                        Head::Bool(b) => bools[b as usize] = true,
                        _ => return Err(got("bool", h)),
                    },
                }
                Ok(())
            })();
            r2.at(|| Step::Index(i))?;
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
            write_json_string(out, &s);
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
        let mut typed = ElementTypes::new(elem);
        for i in 0..n {
            let mut text = Vec::new();
            unmarshal(r, elem, &mut text, depth + 1).at(|| Step::Index(i))?;
            typed.note(Step::Index(i), &text)?;
            texts.push(text);
        }
        typed.check(elem, "set")?;
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

fn unmarshal_tuple(r: &mut Reader, head: Head, elems: &[CtyType], out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = array_len(head, "tuple", depth)?;
    if n != elems.len() {
        return Err(PathError::new(format!("expected tuple of {} elements, got {}", elems.len(), n)));
    }
    out.push(b'[');
    for (i, elem) in elems.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        unmarshal(r, elem, out, depth + 1).at(|| Step::Index(i))?;
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

fn map_key<'a>(r: &mut Reader<'a>) -> Result<Cow<'a, str>> {
    match r.head()? {
        Head::Str(n) => r.text(n),
        h => Err(got("string map key", h)),
    }
}

fn unmarshal_map(r: &mut Reader, head: Head, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n = map_len(head, "map", depth)?;
    let start = out.len();
    out.push(b'{');
    // Written in wire order, reordered at the end only if the keys did not arrive sorted.
    let mut entries: MapEntries<Cow<str>> = MapEntries::new();
    let mut typed = ElementTypes::new(elem);
    for _ in 0..n {
        let key = map_key(r)?;
        if entries.is_duplicate(&key) {
            return Err(PathError::new(format!("duplicate key {}", quote(&key))));
        }
        if !entries.is_empty() {
            out.push(b',');
        }
        write_json_string(out, &key);
        out.push(b':');
        let s = out.len();
        unmarshal(r, elem, out, depth + 1).at(|| Step::Key(key.to_string()))?;
        typed.note(Step::Key(key.to_string()), &out[s..])?;
        entries.push(key, (s, out.len()));
    }
    typed.sort_by_key();
    typed.check(elem, "map")?;
    if let Some(sorted) = entries.unsorted() {
        let written = out.split_off(start);
        out.push(b'{');
        for (i, (key, (s, e))) in sorted.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_string(out, key);
            out.push(b':');
            out.extend_from_slice(&written[s - start..e - start]);
        }
    }
    out.push(b'}');
    Ok(())
}

fn unmarshal_object(r: &mut Reader, head: Head, o: &ObjectType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let n_wire = map_len(head, "object", depth)?;
    let n = o.names.len();
    out.push(b'{');
    let region = out.len();
    let mut seen = AttrSet::new(n);
    let mut next = 0usize; // in order so far: attributes [0, next) are written
    let mut spans: Vec<Span> = Vec::new();
    let mut reordered: Option<Reordered> = None;
    for _ in 0..n_wire {
        let key = map_key(r)?;
        let idx = o.lookup(&key).ok_or_else(|| PathError::new(format!("unknown attribute {}", quote(&key))))?;
        if seen.test_set(idx) {
            return Err(PathError::new(format!("duplicate key {}", quote(&key))));
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
                unmarshal(r, ty, out, depth + 1).at(|| Step::Attr(o.names[idx].clone()))?;
                spans.push((s, out.len()));
                next = idx + 1;
            }
            _ => {
                let side = reordered.get_or_insert_with(|| Reordered::start(out, region, &spans, n));
                let s = side.buf.len();
                unmarshal(r, ty, &mut side.buf, depth + 1).at(|| Step::Attr(o.names[idx].clone()))?;
                side.set(idx, (s, side.buf.len()));
            }
        }
    }
    // Attributes missing on the wire decode as null, like absent ones in cty JSON.
    match reordered {
        None => {
            for (j, key) in o.json_keys.iter().enumerate().skip(next) {
                if j > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(key);
                out.extend_from_slice(b"null");
            }
        }
        Some(side) => {
            for (j, key) in o.json_keys.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(key);
                out.extend_from_slice(side.value(j).unwrap_or(b"null"));
            }
        }
    }
    out.push(b'}');
    Ok(())
}

fn unmarshal_dynamic(r: &mut Reader, head: Head, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    match head {
        Head::Array(2) => {}
        Head::Ext => return Err(PathError::new(UNKNOWN)),
        _ => return Err(PathError::new("expected a [type, value] pair for a dynamic value")),
    }
    let type_json = match r.head()? {
        Head::Str(n) | Head::Bin(n) => r.take(n)?,
        h => return Err(got("type JSON (bin)", h)),
    };
    let concrete = parse_type(type_json).map_err(|mut e| {
        e.at_root = false; // a bad type inside the value is reported where it sits
        e
    })?;
    if matches!(concrete, CtyType::Dynamic) {
        return Err(PathError::new("a dynamic value needs a concrete type, not \"dynamic\""));
    }
    if concrete.contains_dynamic() {
        // Written with the type its value has (as_gocty_json), not the one it came tagged with.
        let mut part = Vec::new();
        unmarshal(r, &concrete, &mut part, depth)?;
        out.extend_from_slice(&as_gocty_json(&parse_document(&part)?, &concrete, true)?);
        return Ok(());
    }
    out.extend_from_slice(b"{\"type\":");
    concrete.write_json(out);
    out.extend_from_slice(b",\"value\":");
    unmarshal(r, &concrete, out, depth)?;
    out.push(b'}');
    Ok(())
}
