//! cty types: parsed from Terraform's JSON type syntax, printed back canonically, inferred from
//! plain JSON at dynamic positions (twin of kilolock/codec/types.py, same error texts).

use crate::error::{CodecErr, Result, MAX_DEPTH};
use crate::json::{parse_document, quote, write_json_string, JVal};
use crate::mp;
use std::collections::HashMap;

#[derive(Debug)]
pub enum Ty {
    String,
    Number,
    Bool,
    Dynamic,
    List(Box<Ty>),
    Set(Box<Ty>),
    Map(Box<Ty>),
    Object(ObjectTy),
    Tuple(Vec<Ty>),
}

#[derive(Debug)]
pub struct ObjectTy {
    /// Attribute names sorted by their UTF-8 bytes: the wire and canonical-JSON order.
    pub names: Vec<String>,
    pub types: Vec<Ty>,
    pub optional: Vec<String>,
    /// Name -> index into `names`.
    pub index: HashMap<String, usize>,
    /// Each name as a msgpack str, ready to copy.
    pub mp_keys: Vec<Vec<u8>>,
    /// Each name as a JSON key with its colon (`"name":`), ready to copy.
    pub json_keys: Vec<Vec<u8>>,
}

impl ObjectTy {
    pub fn new(mut attrs: Vec<(String, Ty)>, optional: Vec<String>) -> Self {
        attrs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let mut names = Vec::with_capacity(attrs.len());
        let mut types = Vec::with_capacity(attrs.len());
        for (n, t) in attrs {
            names.push(n);
            types.push(t);
        }
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        let mp_keys = names
            .iter()
            .map(|n| {
                let mut v = Vec::new();
                mp::write_str(&mut v, n.as_bytes());
                v
            })
            .collect();
        let json_keys = names
            .iter()
            .map(|n| {
                let mut v = Vec::new();
                write_json_string(&mut v, n.as_bytes());
                v.push(b':');
                v
            })
            .collect();
        ObjectTy { names, types, optional, index, mp_keys, json_keys }
    }

    #[inline]
    pub fn lookup(&self, name: &str) -> Option<usize> {
        if self.names.len() <= 8 {
            return self.names.iter().position(|n| n == name);
        }
        self.index.get(name).copied()
    }
}

impl Ty {
    pub fn is_primitive(&self) -> bool {
        matches!(self, Ty::String | Ty::Number | Ty::Bool)
    }

    /// Canonical type JSON: compact, attribute names sorted.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Ty::String => out.extend_from_slice(b"\"string\""),
            Ty::Number => out.extend_from_slice(b"\"number\""),
            Ty::Bool => out.extend_from_slice(b"\"bool\""),
            Ty::Dynamic => out.extend_from_slice(b"\"dynamic\""),
            Ty::List(e) | Ty::Set(e) | Ty::Map(e) => {
                let name: &[u8] = match self {
                    Ty::List(_) => b"[\"list\",",
                    Ty::Set(_) => b"[\"set\",",
                    _ => b"[\"map\",",
                };
                out.extend_from_slice(name);
                e.write_json(out);
                out.push(b']');
            }
            Ty::Tuple(elems) => {
                out.extend_from_slice(b"[\"tuple\",[");
                for (i, e) in elems.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    e.write_json(out);
                }
                out.extend_from_slice(b"]]");
            }
            Ty::Object(o) => {
                out.extend_from_slice(b"[\"object\",{");
                for (i, t) in o.types.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(&o.json_keys[i]);
                    t.write_json(out);
                }
                out.push(b'}');
                if !o.optional.is_empty() {
                    out.extend_from_slice(b",[");
                    for (i, n) in o.optional.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        write_json_string(out, n.as_bytes());
                    }
                    out.push(b']');
                }
                out.push(b']');
            }
        }
    }

    pub fn json(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_json(&mut v);
        v
    }
}

fn invalid(msg: impl AsRef<str>) -> CodecErr {
    CodecErr::new(format!("invalid type: {}", msg.as_ref()))
}

/// Compile Terraform's JSON type syntax.
pub fn parse_type(data: &[u8]) -> Result<Ty> {
    let spec = parse_document(data)?;
    type_from_json(&spec, 0)
}

pub fn type_from_json(spec: &JVal, depth: usize) -> Result<Ty> {
    let items = match spec {
        JVal::Str(s) => {
            return match s.as_str() {
                "string" => Ok(Ty::String),
                "number" => Ok(Ty::Number),
                "bool" => Ok(Ty::Bool),
                "dynamic" => Ok(Ty::Dynamic),
                _ => Err(invalid(format!("unknown type name {}", quote(s)))),
            }
        }
        JVal::Arr(items) if matches!(items.first(), Some(JVal::Str(_))) => items,
        _ => return Err(invalid("expected a type name or [kind, ...] array")),
    };
    if depth >= MAX_DEPTH {
        return Err(invalid(format!("nested deeper than {} levels", MAX_DEPTH)));
    }
    let name = match &items[0] {
        JVal::Str(s) => s.as_str(),
        _ => unreachable!(),
    };
    match name {
        "list" | "set" | "map" => {
            if items.len() != 2 {
                return Err(invalid(format!("{} takes exactly one element type", name)));
            }
            let elem = Box::new(type_from_json(&items[1], depth + 1)?);
            Ok(match name {
                "list" => Ty::List(elem),
                "set" => Ty::Set(elem),
                _ => Ty::Map(elem),
            })
        }
        "tuple" => match (items.len(), items.get(1)) {
            (2, Some(JVal::Arr(elems))) => {
                let mut out = Vec::with_capacity(elems.len());
                for e in elems {
                    out.push(type_from_json(e, depth + 1)?);
                }
                Ok(Ty::Tuple(out))
            }
            _ => Err(invalid("tuple takes an array of element types")),
        },
        "object" => {
            let members = match (items.len(), items.get(1)) {
                (2 | 3, Some(JVal::Obj(m))) => m,
                _ => return Err(invalid("object takes an object of attribute types")),
            };
            let mut attrs: Vec<(String, Ty)> = Vec::with_capacity(members.len());
            let mut seen: HashMap<&str, ()> = HashMap::with_capacity(members.len());
            for (k, v) in members {
                if seen.insert(k.as_str(), ()).is_some() {
                    return Err(invalid(format!("duplicate attribute {}", quote(k))));
                }
                attrs.push((k.clone(), type_from_json(v, depth + 1)?));
            }
            let mut optional: Vec<String> = Vec::new();
            if items.len() == 3 {
                let opts = match &items[2] {
                    JVal::Arr(o) => o,
                    _ => return Err(invalid("optional attributes must be an array of names")),
                };
                for o in opts {
                    match o {
                        JVal::Str(s) if seen.contains_key(s.as_str()) => {
                            if !optional.contains(s) {
                                optional.push(s.clone());
                            }
                        }
                        _ => return Err(invalid("optional attribute is not an attribute of the object")),
                    }
                }
                optional.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            }
            Ok(Ty::Object(ObjectTy::new(attrs, optional)))
        }
        _ => Err(invalid(format!("unknown type kind {}", quote(name)))),
    }
}

/// The concrete type of a plain JSON value at a dynamic position (null stays dynamic).
pub fn infer_type(v: &JVal, depth: usize) -> Result<Ty> {
    match v {
        JVal::Null => Ok(Ty::Dynamic),
        JVal::Bool(_) => Ok(Ty::Bool),
        JVal::Num(_) => Ok(Ty::Number),
        JVal::Str(_) => Ok(Ty::String),
        JVal::Obj(members) => {
            if depth >= MAX_DEPTH {
                return Err(crate::error::too_deep());
            }
            let mut attrs: Vec<(String, Ty)> = Vec::with_capacity(members.len());
            let mut seen: HashMap<&str, ()> = HashMap::with_capacity(members.len());
            for (k, item) in members {
                if seen.insert(k.as_str(), ()).is_some() {
                    return Err(CodecErr::new(format!("duplicate key {}", quote(k))));
                }
                attrs.push((k.clone(), infer_type(item, depth + 1)?));
            }
            Ok(Ty::Object(ObjectTy::new(attrs, Vec::new())))
        }
        JVal::Arr(items) => {
            if depth >= MAX_DEPTH {
                return Err(crate::error::too_deep());
            }
            let mut elems = Vec::with_capacity(items.len());
            for item in items {
                elems.push(infer_type(item, depth + 1)?);
            }
            Ok(Ty::Tuple(elems))
        }
    }
}

/// Object attributes are written in sorted order as they arrive; when one arrives out of order,
/// what was written so far (from `region` on) moves to a side buffer with each attribute's span,
/// and the object is assembled from there in sorted order. Shared by both directions.
pub(crate) fn start_reordering(
    out: &mut Vec<u8>,
    region: usize,
    spans: &[(usize, usize)],
    n: usize,
) -> (Vec<u8>, Vec<Option<(usize, usize)>>) {
    let temp = out.split_off(region);
    let mut ranges = vec![None; n];
    for (j, &(s, e)) in spans.iter().enumerate() {
        ranges[j] = Some((s - region, e - region));
    }
    (temp, ranges)
}
