//! marshal: cty JSON -> msgpack, streaming through the JSON text with the type in hand (twin of
//! kilolock/codec/pure/marshal.py). Input already in the wire's order (state JSON is written with
//! sorted keys) goes straight to the output; anything else is reordered.

use crate::errors::{too_deep, AtStep, PathError, Result, Step, MAX_DEPTH};
use crate::jsontext::{nfc, quote, write_jval, Kind, Parser};
use crate::mp;
use crate::numbers::{cmp_dec, parse_number, wire_form, Dec, Wire, OUT_OF_RANGE};
use crate::order::{AttrSet, MapEntries, Reordered, Span};
use crate::jsontext::parse_document;
use crate::types::{as_gocty_json, as_own_type, infer_type, type_from_json, wrapper_parts, CtyType, ElementTypes, ObjectType};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

/// Encode a whole JSON document.
pub fn encode(data: &[u8], ty: &CtyType) -> Result<Vec<u8>> {
    let mut p = Parser::new(data)?;
    let mut out = Vec::with_capacity(data.len() / 2 + 16);
    marshal(&mut p, ty, &mut out, 0)?;
    p.finish()?;
    if ty.has_dynamic_collection() {
        // Checked, now sent as go-cty sends the value it reads: a null dynamic element with its
        // collection's element type (as_gocty_json).
        let text = as_gocty_json(&parse_document(data)?, ty, false)?;
        out.clear();
        let mut p = Parser { s: &text, pos: 0 };
        marshal(&mut p, ty, &mut out, 0)?;
    }
    Ok(out)
}

#[inline]
fn expected(what: &str, kind: Kind) -> PathError {
    PathError::new(format!("expected {}, got {}", what, kind.name()))
}

pub fn marshal(p: &mut Parser, ty: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let kind = p.peek_kind()?;
    if kind == Kind::Null {
        p.literal(b"null")?;
        mp::write_nil(out);
        return Ok(());
    }
    match ty {
        CtyType::String => marshal_string(p, kind, out),
        CtyType::Number => marshal_number(p, kind, out),
        CtyType::Bool => marshal_bool(p, kind, out),
        CtyType::List(elem) => marshal_list(p, kind, elem, out, depth),
        CtyType::Set(elem) => marshal_set(p, kind, elem, out, depth),
        CtyType::Map(elem) => marshal_map(p, kind, elem, out, depth),
        CtyType::Object(o) => marshal_object(p, kind, o, out, depth),
        CtyType::Tuple(elems) => marshal_tuple(p, kind, elems, out, depth),
        CtyType::Dynamic => marshal_dynamic(p, out, depth),
    }
}

fn marshal_string(p: &mut Parser, kind: Kind, out: &mut Vec<u8>) -> Result<()> {
    if kind != Kind::String {
        return Err(expected("string", kind));
    }
    let s = nfc(p.string()?);
    mp::write_str(out, s.as_bytes());
    Ok(())
}

fn number_dec(text: &[u8]) -> Result<Dec> {
    parse_number(text).map_err(|e| PathError::invalid_json(if e == OUT_OF_RANGE { OUT_OF_RANGE } else { e }))
}

fn write_number(d: &Dec, out: &mut Vec<u8>) {
    match wire_form(d) {
        Wire::Int(v) => mp::write_int(out, v),
        Wire::Float(f) => mp::write_f64(out, f),
        Wire::Str(s) => mp::write_str(out, s.as_bytes()),
    }
}

fn marshal_number(p: &mut Parser, kind: Kind, out: &mut Vec<u8>) -> Result<()> {
    if kind != Kind::Number {
        return Err(expected("number", kind));
    }
    let text = p.number_text()?;
    // Fast path: a short integer literal is always an int64.
    if text.len() <= 18 && !text.iter().any(|&c| c == b'.' || c == b'e' || c == b'E') {
        let (neg, digits) = if text[0] == b'-' { (true, &text[1..]) } else { (false, text) };
        let mut v: i64 = 0;
        for &c in digits {
            v = v * 10 + (c - b'0') as i64;
        }
        mp::write_int(out, if neg { -v } else { v });
        return Ok(());
    }
    write_number(&number_dec(text)?, out);
    Ok(())
}

fn marshal_bool(p: &mut Parser, kind: Kind, out: &mut Vec<u8>) -> Result<()> {
    if kind != Kind::Bool {
        return Err(expected("bool", kind));
    }
    mp::write_bool(out, p.parse_bool()?);
    Ok(())
}

fn open(p: &mut Parser, kind: Kind, want: Kind, what: &str, depth: usize) -> Result<()> {
    if kind != want {
        return Err(expected(what, kind));
    }
    if depth >= MAX_DEPTH {
        return Err(too_deep());
    }
    p.bump();
    Ok(())
}

fn marshal_list(p: &mut Parser, kind: Kind, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    open(p, kind, Kind::Array, "list", depth)?;
    let start = out.len();
    let mut count = 0usize;
    let mut typed = ElementTypes::new(elem);
    if !p.empty_close(b']') {
        loop {
            let from = p.pos;
            marshal(p, elem, out, depth + 1).at(|| Step::Index(count))?;
            typed.note(Step::Index(count), &p.s[from..p.pos])?;
            count += 1;
            if !p.next_or_close(b']')? {
                break;
            }
        }
    }
    typed.check(elem, "list")?;
    mp::insert_header(out, start, count, false);
    Ok(())
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Drops byte-equal repeats of the set elements written so far, keeping first occurrences.
#[derive(Default)]
struct Dedup {
    seen: HashMap<u64, Vec<Span>>,
}

impl Dedup {
    /// The element at `out[s..]` was just written: keep it (true) or drop it (false).
    fn keep(&mut self, out: &mut Vec<u8>, s: usize) -> bool {
        let e = out.len();
        let h = fnv(&out[s..e]);
        let spans = self.seen.entry(h).or_default();
        if spans.iter().any(|&(a, b)| out[a..b] == out[s..e]) {
            out.truncate(s);
            return false;
        }
        spans.push((s, e));
        true
    }
}

fn marshal_set(p: &mut Parser, kind: Kind, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    open(p, kind, Kind::Array, "set", depth)?;
    if elem.is_primitive() {
        return marshal_primitive_set(p, elem, out);
    }
    // cty orders sets of non-primitive values by hash; the order given is the order providers
    // send back, so it is kept. Equal elements collapse, as they would in a cty set.
    let start = out.len();
    let mut count = 0usize;
    let mut dedup = Dedup::default();
    let mut typed = ElementTypes::new(elem);
    if !p.empty_close(b']') {
        let mut i = 0usize;
        loop {
            let s = out.len();
            let from = p.pos;
            marshal(p, elem, out, depth + 1).at(|| Step::Index(i))?;
            typed.note(Step::Index(i), &p.s[from..p.pos])?;
            if dedup.keep(out, s) {
                count += 1;
            }
            i += 1;
            if !p.next_or_close(b']')? {
                break;
            }
        }
    }
    typed.check(elem, "set")?;
    mp::insert_header(out, start, count, false);
    Ok(())
}

/// cty's order for sets of primitives: strings by UTF-8 bytes, numbers numerically, false before
/// true, nulls last; duplicates collapse.
fn marshal_primitive_set(p: &mut Parser, elem: &CtyType, out: &mut Vec<u8>) -> Result<()> {
    let mut strings: Vec<Cow<str>> = Vec::new();
    let mut numbers: Vec<Dec> = Vec::new();
    let mut bools = [false, false];
    let mut has_null = false;
    if !p.empty_close(b']') {
        let mut i = 0usize;
        loop {
            let kind = p.peek_kind()?;
            let r: Result<()> = (|| {
                if kind == Kind::Null {
                    p.literal(b"null")?;
                    has_null = true;
                    return Ok(());
                }
                match elem {
                    CtyType::String => {
                        if kind != Kind::String {
                            return Err(expected("string", kind));
                        }
                        strings.push(nfc(p.string()?));
                    }
                    CtyType::Number => {
                        if kind != Kind::Number {
                            return Err(expected("number", kind));
                        }
                        let text = p.number_text()?;
                        numbers.push(number_dec(text)?);
                    }
                    _ => {
                        if kind != Kind::Bool {
                            return Err(expected("bool", kind));
                        }
                        bools[p.parse_bool()? as usize] = true;
                    }
                }
                Ok(())
            })();
            r.at(|| Step::Index(i))?;
            i += 1;
            if !p.next_or_close(b']')? {
                break;
            }
        }
    }
    strings.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    strings.dedup();
    numbers.sort_by(cmp_dec);
    numbers.dedup_by(|a, b| cmp_dec(a, b) == Ordering::Equal);
    let n = strings.len() + numbers.len() + bools[0] as usize + bools[1] as usize + has_null as usize;
    mp::write_array_header(out, n);
    for s in &strings {
        mp::write_str(out, s.as_bytes());
    }
    for d in &numbers {
        write_number(d, out);
    }
    if bools[0] {
        mp::write_bool(out, false);
    }
    if bools[1] {
        mp::write_bool(out, true);
    }
    if has_null {
        mp::write_nil(out);
    }
    Ok(())
}

fn marshal_tuple(p: &mut Parser, kind: Kind, elems: &[CtyType], out: &mut Vec<u8>, depth: usize) -> Result<()> {
    open(p, kind, Kind::Array, "tuple", depth)?;
    // The length is checked before any element, as a whole-value walk would.
    let body = p.pos;
    let mut count = 0usize;
    if !p.empty_close(b']') {
        loop {
            p.skip_value(depth + 1)?;
            count += 1;
            if !p.next_or_close(b']')? {
                break;
            }
        }
    }
    if count != elems.len() {
        return Err(PathError::new(format!("expected tuple of {} elements, got {}", elems.len(), count)));
    }
    p.pos = body;
    mp::write_array_header(out, count);
    if !p.empty_close(b']') {
        let mut i = 0usize;
        loop {
            marshal(p, &elems[i], out, depth + 1).at(|| Step::Index(i))?;
            i += 1;
            if !p.next_or_close(b']')? {
                break;
            }
        }
    }
    Ok(())
}

fn marshal_map(p: &mut Parser, kind: Kind, elem: &CtyType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    open(p, kind, Kind::Object, "map", depth)?;
    let start = out.len();
    // Entries go out in document order, reordered at the end only when the keys did not arrive sorted.
    let mut entries: MapEntries<Cow<str>> = MapEntries::new();
    let mut typed = ElementTypes::new(elem);
    if !p.empty_close(b'}') {
        loop {
            let key = nfc(p.key()?); // cty.MapVal normalizes keys: two spellings of one key repeat it
            if entries.is_duplicate(&key) {
                return Err(PathError::new(format!("duplicate key {}", quote(&key))));
            }
            let s = out.len();
            mp::write_str(out, key.as_bytes());
            let from = p.pos;
            marshal(p, elem, out, depth + 1).at(|| Step::Key(key.to_string()))?;
            typed.note(Step::Key(key.to_string()), &p.s[from..p.pos])?;
            entries.push(key, (s, out.len()));
            if !p.next_or_close(b'}')? {
                break;
            }
        }
    }
    typed.sort_by_key();
    typed.check(elem, "map")?;
    let n = entries.len();
    if let Some(sorted) = entries.unsorted() {
        let written = out.split_off(start);
        for (_, (s, e)) in &sorted {
            out.extend_from_slice(&written[s - start..e - start]);
        }
    }
    mp::insert_header(out, start, n, true);
    Ok(())
}

fn marshal_object(p: &mut Parser, kind: Kind, o: &ObjectType, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    open(p, kind, Kind::Object, "object", depth)?;
    let n = o.names.len();
    // Every attribute goes on the wire, absent ones as nil, in sorted order.
    mp::write_map_header(out, n);
    let region = out.len();
    let mut seen = AttrSet::new(n);
    let mut next = 0usize; // in order so far: attributes [0, next) are written (value or nil)
    let mut spans: Vec<Span> = Vec::new(); // their value spans in `out`
    let mut reordered: Option<Reordered> = None;
    if !p.empty_close(b'}') {
        loop {
            let key = p.key()?;
            let idx = o.lookup(&key).ok_or_else(|| PathError::new(format!("unknown attribute {}", quote(&key))))?;
            if seen.test_set(idx) {
                return Err(PathError::new(format!("duplicate key {}", quote(&key))));
            }
            let ty = &o.types[idx];
            match reordered.as_mut() {
                None if idx >= next => {
                    for j in next..idx {
                        out.extend_from_slice(&o.mp_keys[j]);
                        let s = out.len();
                        mp::write_nil(out);
                        spans.push((s, out.len()));
                    }
                    out.extend_from_slice(&o.mp_keys[idx]);
                    let s = out.len();
                    marshal(p, ty, out, depth + 1).at(|| Step::Attr(o.names[idx].clone()))?;
                    spans.push((s, out.len()));
                    next = idx + 1;
                }
                _ => {
                    let side = reordered.get_or_insert_with(|| Reordered::start(out, region, &spans, n));
                    let s = side.buf.len();
                    marshal(p, ty, &mut side.buf, depth + 1).at(|| Step::Attr(o.names[idx].clone()))?;
                    side.set(idx, (s, side.buf.len()));
                }
            }
            if !p.next_or_close(b'}')? {
                break;
            }
        }
    }
    match reordered {
        None => {
            for key in &o.mp_keys[next..] {
                out.extend_from_slice(key);
                mp::write_nil(out);
            }
        }
        Some(side) => {
            for (j, key) in o.mp_keys.iter().enumerate() {
                out.extend_from_slice(key);
                match side.value(j) {
                    Some(value) => out.extend_from_slice(value),
                    None => mp::write_nil(out),
                }
            }
        }
    }
    Ok(())
}

fn marshal_dynamic(p: &mut Parser, out: &mut Vec<u8>, depth: usize) -> Result<()> {
    let value = p.value(depth)?;
    let (concrete, inner) = match wrapper_parts(&value) {
        Some((spec, inner)) => (type_from_json(spec, 0)?, inner),
        None => (infer_type(&value, depth)?, &value), // the ADR's case: a plain value, type from its JSON
    };
    if matches!(concrete, CtyType::Dynamic) {
        return Err(PathError::new("a dynamic value needs a concrete type, not \"dynamic\""));
    }
    // Re-walk the (already validated) inner value with the streaming marshaller.
    let mut text = Vec::new();
    write_jval(&mut text, inner);
    let (concrete, text) = if concrete.contains_dynamic() && wrapper_parts(&value).is_some() {
        // Checked, then sent with the type its value has (as_own_type), as go-cty sends it.
        marshal(&mut Parser { s: &text, pos: 0 }, &concrete, &mut Vec::new(), depth)?;
        as_own_type(inner, &concrete)?
    } else {
        (concrete, text)
    };
    mp::write_array_header(out, 2);
    mp::write_bin(out, &concrete.json());
    let mut sub = Parser { s: &text, pos: 0 };
    marshal(&mut sub, &concrete, out, depth)
}
