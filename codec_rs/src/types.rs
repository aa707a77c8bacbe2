//! cty types: parsed from Terraform's JSON type syntax, printed back canonically, inferred from
//! plain JSON at dynamic positions (twin of kilolock/codec/pure/types.py, same error texts).

use crate::errors::{PathError, Result, Step, MAX_DEPTH};
use crate::jsontext::{nfc, parse_document, quote, write_json_string, write_jval_numbers, JVal};
use std::borrow::Cow;
use std::cmp::Ordering;
use crate::mp;
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub enum CtyType {
    String,
    Number,
    Bool,
    Dynamic,
    List(Box<CtyType>),
    Set(Box<CtyType>),
    Map(Box<CtyType>),
    Object(ObjectType),
    Tuple(Vec<CtyType>),
}

#[derive(Debug, Clone)]
pub struct ObjectType {
    /// Attribute names sorted by their UTF-8 bytes: the wire and canonical-JSON order.
    pub names: Vec<String>,
    pub types: Vec<CtyType>,
    pub optional: Vec<String>,
    /// Name -> index into `names`.
    pub index: HashMap<String, usize>,
    /// Each name as a msgpack str, ready to copy.
    pub mp_keys: Vec<Vec<u8>>,
    /// Each name as a JSON key with its colon (`"name":`), ready to copy.
    pub json_keys: Vec<Vec<u8>>,
    /// Whether an attribute's type has `dynamic` in it (see `CtyType::contains_dynamic`).
    pub has_dynamic: bool,
    /// Whether an attribute's type has a collection of dynamic in it (`has_dynamic_collection`).
    pub has_dynamic_collection: bool,
}

impl ObjectType {
    pub fn new(mut attrs: Vec<(String, CtyType)>, optional: Vec<String>) -> Self {
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
                write_json_string(&mut v, n);
                v.push(b':');
                v
            })
            .collect();
        let has_dynamic = types.iter().any(CtyType::contains_dynamic);
        let has_dynamic_collection = types.iter().any(CtyType::has_dynamic_collection);
        ObjectType { names, types, optional, index, mp_keys, json_keys, has_dynamic, has_dynamic_collection }
    }

    #[inline]
    pub fn lookup(&self, name: &str) -> Option<usize> {
        if self.names.len() <= 8 {
            return self.names.iter().position(|n| n == name);
        }
        self.index.get(name).copied()
    }
}

impl CtyType {
    pub fn is_primitive(&self) -> bool {
        matches!(self, CtyType::String | CtyType::Number | CtyType::Bool)
    }

    /// Whether a value's own type may differ from this one (see `actual_type`).
    pub fn contains_dynamic(&self) -> bool {
        match self {
            CtyType::Dynamic => true,
            CtyType::String | CtyType::Number | CtyType::Bool => false,
            CtyType::List(e) | CtyType::Set(e) | CtyType::Map(e) => e.contains_dynamic(),
            CtyType::Object(o) => o.has_dynamic,
            CtyType::Tuple(elems) => elems.iter().any(CtyType::contains_dynamic),
        }
    }

    /// Whether a list, set or map in it has dynamic in its element type (a null dynamic element
    /// of one takes the element type of the others).
    pub fn has_dynamic_collection(&self) -> bool {
        match self {
            CtyType::List(e) | CtyType::Set(e) | CtyType::Map(e) => e.contains_dynamic(),
            CtyType::Object(o) => o.has_dynamic_collection,
            CtyType::Tuple(elems) => elems.iter().any(CtyType::has_dynamic_collection),
            _ => false,
        }
    }

    fn collection_name(&self) -> &'static str {
        match self {
            CtyType::List(_) => "list",
            CtyType::Set(_) => "set",
            _ => "map",
        }
    }

    /// Canonical type JSON: compact, attribute names sorted.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            CtyType::String => out.extend_from_slice(b"\"string\""),
            CtyType::Number => out.extend_from_slice(b"\"number\""),
            CtyType::Bool => out.extend_from_slice(b"\"bool\""),
            CtyType::Dynamic => out.extend_from_slice(b"\"dynamic\""),
            CtyType::List(e) | CtyType::Set(e) | CtyType::Map(e) => {
                let name: &[u8] = match self {
                    CtyType::List(_) => b"[\"list\",",
                    CtyType::Set(_) => b"[\"set\",",
                    _ => b"[\"map\",",
                };
                out.extend_from_slice(name);
                e.write_json(out);
                out.push(b']');
            }
            CtyType::Tuple(elems) => {
                out.extend_from_slice(b"[\"tuple\",[");
                for (i, e) in elems.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    e.write_json(out);
                }
                out.extend_from_slice(b"]]");
            }
            CtyType::Object(o) => {
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
                        write_json_string(out, n);
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

fn invalid(msg: impl AsRef<str>) -> PathError {
    PathError::new(format!("invalid type: {}", msg.as_ref()))
}

/// Compile Terraform's JSON type syntax.
pub fn parse_type(data: &[u8]) -> Result<CtyType> {
    let spec = parse_document(data)?;
    type_from_json(&spec, 0)
}

pub fn type_from_json(spec: &JVal, depth: usize) -> Result<CtyType> {
    let (name, items) = match spec {
        JVal::Str(s) => {
            return match s.as_str() {
                "string" => Ok(CtyType::String),
                "number" => Ok(CtyType::Number),
                "bool" => Ok(CtyType::Bool),
                "dynamic" => Ok(CtyType::Dynamic),
                _ => Err(invalid(format!("unknown type name {}", quote(s)))),
            }
        }
        JVal::Arr(items) => match items.first() {
            Some(JVal::Str(name)) => (name.as_str(), items),
            _ => return Err(invalid("expected a type name or [kind, ...] array")),
        },
        _ => return Err(invalid("expected a type name or [kind, ...] array")),
    };
    if depth >= MAX_DEPTH {
        return Err(invalid(format!("nested deeper than {} levels", MAX_DEPTH)));
    }
    match name {
        "list" | "set" | "map" => {
            if items.len() != 2 {
                return Err(invalid(format!("{} takes exactly one element type", name)));
            }
            let elem = Box::new(type_from_json(&items[1], depth + 1)?);
            Ok(match name {
                "list" => CtyType::List(elem),
                "set" => CtyType::Set(elem),
                _ => CtyType::Map(elem),
            })
        }
        "tuple" => match (items.len(), items.get(1)) {
            (2, Some(JVal::Arr(elems))) => {
                let mut out = Vec::with_capacity(elems.len());
                for e in elems {
                    out.push(type_from_json(e, depth + 1)?);
                }
                Ok(CtyType::Tuple(out))
            }
            _ => Err(invalid("tuple takes an array of element types")),
        },
        "object" => {
            let members = match (items.len(), items.get(1)) {
                (2 | 3, Some(JVal::Obj(m))) => m,
                _ => return Err(invalid("object takes an object of attribute types")),
            };
            let mut attrs: Vec<(String, CtyType)> = Vec::with_capacity(members.len());
            let mut seen: HashMap<String, ()> = HashMap::with_capacity(members.len());
            for (k, v) in members {
                // As go-cty's cty.Object keys its attributes: NFC, what it writes and reads.
                let k = nfc(Cow::Borrowed(k.as_str())).into_owned();
                if seen.insert(k.clone(), ()).is_some() {
                    return Err(invalid(format!("duplicate attribute {}", quote(&k))));
                }
                attrs.push((k, type_from_json(v, depth + 1)?));
            }
            let mut optional: Vec<String> = Vec::new();
            if items.len() == 3 {
                let opts = match &items[2] {
                    JVal::Arr(o) => o,
                    _ => return Err(invalid("optional attributes must be an array of names")),
                };
                for o in opts {
                    match o {
                        JVal::Str(s) if seen.contains_key(nfc(Cow::Borrowed(s.as_str())).as_ref()) => {
                            let s = nfc(Cow::Borrowed(s.as_str())).into_owned();
                            if !optional.contains(&s) {
                                optional.push(s);
                            }
                        }
                        _ => return Err(invalid("optional attribute is not an attribute of the object")),
                    }
                }
                optional.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            }
            Ok(CtyType::Object(ObjectType::new(attrs, optional)))
        }
        _ => Err(invalid(format!("unknown type kind {}", quote(name)))),
    }
}

/// The concrete type of a plain JSON value at a dynamic position (null stays dynamic).
pub fn infer_type(v: &JVal, depth: usize) -> Result<CtyType> {
    match v {
        JVal::Null => Ok(CtyType::Dynamic),
        JVal::Bool(_) => Ok(CtyType::Bool),
        JVal::Num(_) => Ok(CtyType::Number),
        JVal::Str(_) => Ok(CtyType::String),
        JVal::Obj(members) => {
            if depth >= MAX_DEPTH {
                return Err(crate::errors::too_deep());
            }
            let mut attrs: Vec<(String, CtyType)> = Vec::with_capacity(members.len());
            let mut seen: HashMap<&str, ()> = HashMap::with_capacity(members.len());
            for (k, item) in members {
                if seen.insert(k.as_str(), ()).is_some() {
                    return Err(PathError::new(format!("duplicate key {}", quote(k))));
                }
                attrs.push((k.clone(), infer_type(item, depth + 1)?));
            }
            Ok(CtyType::Object(ObjectType::new(attrs, Vec::new())))
        }
        JVal::Arr(items) => {
            if depth >= MAX_DEPTH {
                return Err(crate::errors::too_deep());
            }
            let mut elems = Vec::with_capacity(items.len());
            for item in items {
                elems.push(infer_type(item, depth + 1)?);
            }
            Ok(CtyType::Tuple(elems))
        }
    }
}

/// `(type spec, value)` when the value is exactly a `{"type": ..., "value": ...}` wrapper.
pub fn wrapper_parts(v: &JVal) -> Option<(&JVal, &JVal)> {
    if let JVal::Obj(members) = v {
        if members.len() == 2 {
            let (k1, v1) = &members[0];
            let (k2, v2) = &members[1];
            if k1 == "type" && k2 == "value" {
                return Some((v1, v2));
            }
            if k1 == "value" && k2 == "type" {
                return Some((v2, v1));
            }
        }
    }
    None
}

const DYNAMIC_JSON: &[u8] = b"\"dynamic\"";

/// The type (canonical JSON) go-cty gives the value this JSON makes at declared type `t` (twin of
/// `actual_type` in types.py, which says how).
pub fn actual_type(v: &JVal, t: &CtyType) -> Result<Vec<u8>> {
    if !t.contains_dynamic() {
        return Ok(t.json());
    }
    if let CtyType::Dynamic = t {
        return match (v, wrapper_parts(v)) {
            (JVal::Null, _) => Ok(DYNAMIC_JSON.to_vec()),
            (_, Some((spec, inner))) => actual_type(inner, &type_from_json(spec, 0)?),
            (_, None) => actual_type(v, &infer_type(v, 0)?),
        };
    }
    let mut out = Vec::new();
    match (t, v) {
        (CtyType::Object(o), JVal::Obj(members)) => {
            out.extend_from_slice(b"[\"object\",{");
            for (i, (name, ty)) in o.names.iter().zip(&o.types).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json_keys[i]);
                let member = members.iter().find(|(k, _)| k == name).map(|(_, m)| m).unwrap_or(&JVal::Null);
                out.extend_from_slice(&actual_type(member, ty)?);
            }
            out.extend_from_slice(b"}]");
        }
        (CtyType::Tuple(elems), JVal::Arr(items)) => {
            out.extend_from_slice(b"[\"tuple\",[");
            for (i, (item, ty)) in items.iter().zip(elems).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&actual_type(item, ty)?);
            }
            out.extend_from_slice(b"]]");
        }
        (CtyType::List(e) | CtyType::Set(e) | CtyType::Map(e), JVal::Arr(_) | JVal::Obj(_)) => {
            let items: Vec<&JVal> = match v {
                JVal::Obj(members) => members.iter().map(|(_, m)| m).collect(),
                JVal::Arr(items) => items.iter().collect(),
                _ => Vec::new(),
            };
            if items.is_empty() {
                return Ok(t.json());
            }
            let mut elem = DYNAMIC_JSON.to_vec();
            for item in items {
                elem = actual_type(item, e)?;
                if elem != DYNAMIC_JSON {
                    break;
                }
            }
            out.extend_from_slice(format!("[\"{}\",", t.collection_name()).as_bytes());
            out.extend_from_slice(&elem);
            out.push(b']');
        }
        _ => return Ok(t.json()), // null (or a shape the walk already refused)
    }
    Ok(out)
}

/// go-cty builds a list, set or map only from elements of one type (twin of
/// `check_one_element_type` in types.py): the elements of a `collection` ("list", "set", "map")
/// of `elem`, given as path steps and their JSON, must agree, or it is an error at the first
/// element that differs.
pub fn check_one_element_type(items: &[(Step, JVal)], elem: &CtyType, collection: &str) -> Result<()> {
    let mut first: Option<Vec<u8>> = None;
    for (step, item) in items {
        let this = actual_type(item, elem)?;
        if this == DYNAMIC_JSON {
            continue;
        }
        match &first {
            None => first = Some(this),
            Some(f) if *f != this => {
                let mut e = PathError::new(format!(
                    "element type {} differs from {} of the earlier elements: a {}'s elements must all have one type",
                    String::from_utf8_lossy(&this),
                    String::from_utf8_lossy(f),
                    collection
                ));
                e.segments.push(step.clone());
                return Err(e);
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The elements of a collection whose element type has `dynamic` in it, kept (as their JSON) to
/// check they share one type; nothing is kept for other element types.
pub struct ElementTypes {
    items: Option<Vec<(Step, JVal)>>,
}

impl ElementTypes {
    pub fn new(elem: &CtyType) -> Self {
        ElementTypes { items: elem.contains_dynamic().then(Vec::new) }
    }

    pub fn note(&mut self, step: Step, json: &[u8]) -> Result<()> {
        if let Some(items) = self.items.as_mut() {
            items.push((step, parse_document(json)?));
        }
        Ok(())
    }

    /// A map's elements are checked in key order, the order of its canonical JSON.
    pub fn sort_by_key(&mut self) {
        if let Some(items) = self.items.as_mut() {
            items.sort_by(|a, b| match (&a.0, &b.0) {
                (Step::Key(x), Step::Key(y)) => x.as_bytes().cmp(y.as_bytes()),
                _ => Ordering::Equal,
            });
        }
    }

    pub fn check(self, elem: &CtyType, collection: &str) -> Result<()> {
        match self.items {
            Some(items) => check_one_element_type(&items, elem, collection),
            None => Ok(()),
        }
    }
}

/// A value with the type go-cty gives it (twin of `Typed` in types.py).
pub struct Typed<'v> {
    ty: CtyType,
    body: Body<'v>,
}

enum Body<'v> {
    /// A value whose type has no dynamic in it (or a null): its JSON as given.
    Leaf(&'v JVal),
    /// A list's, set's or tuple's elements.
    Items(Vec<Typed<'v>>),
    /// A map's keys or an object's names, each with its value.
    Members(Vec<(String, Typed<'v>)>),
}

const NULL: JVal = JVal::Null;

/// The value this JSON makes in go-cty (twin of `typed` in types.py).
pub fn typed<'v>(v: &'v JVal, t: &CtyType) -> Result<Typed<'v>> {
    if let CtyType::Dynamic = t {
        return match (v, wrapper_parts(v)) {
            (JVal::Null, _) => Ok(Typed { ty: CtyType::Dynamic, body: Body::Leaf(&NULL) }),
            (_, Some((spec, inner))) => typed(inner, &type_from_json(spec, 0)?),
            (_, None) => typed(v, &infer_type(v, 0)?),
        };
    }
    if matches!(v, JVal::Null) || !t.contains_dynamic() {
        return Ok(Typed { ty: t.clone(), body: Body::Leaf(v) });
    }
    match (t, v) {
        (CtyType::Object(o), JVal::Obj(members)) => {
            let mut attrs = Vec::with_capacity(o.names.len());
            for (name, ty) in o.names.iter().zip(&o.types) {
                let member = members.iter().find(|(k, _)| k == name).map(|(_, m)| m).unwrap_or(&NULL);
                attrs.push((name.clone(), typed(member, ty)?));
            }
            let ty = CtyType::Object(ObjectType::new(
                attrs.iter().map(|(n, a)| (n.clone(), a.ty.clone())).collect(),
                Vec::new(),
            ));
            Ok(Typed { ty, body: Body::Members(attrs) })
        }
        (CtyType::Tuple(elems), JVal::Arr(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (item, ty) in items.iter().zip(elems) {
                out.push(typed(item, ty)?);
            }
            let ty = CtyType::Tuple(out.iter().map(|e| e.ty.clone()).collect());
            Ok(Typed { ty, body: Body::Items(out) })
        }
        (CtyType::Map(e), JVal::Obj(members)) if !members.is_empty() => {
            let mut pairs = Vec::with_capacity(members.len());
            for (k, m) in members {
                pairs.push((k.clone(), typed(m, e)?));
            }
            let elem = element_type(pairs.iter().map(|(_, p)| p));
            let pairs = pairs.into_iter().map(|(k, p)| (k, retyped(p, &elem))).collect();
            Ok(Typed { ty: CtyType::Map(Box::new(elem)), body: Body::Members(pairs) })
        }
        (CtyType::List(e) | CtyType::Set(e), JVal::Arr(items)) if !items.is_empty() => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(typed(item, e)?);
            }
            let elem = element_type(out.iter());
            let out = out.into_iter().map(|p| retyped(p, &elem)).collect();
            let ty = match t {
                CtyType::List(_) => CtyType::List(Box::new(elem)),
                _ => CtyType::Set(Box::new(elem)),
            };
            Ok(Typed { ty, body: Body::Items(out) })
        }
        _ => Ok(Typed { ty: t.clone(), body: Body::Leaf(v) }),
    }
}

fn element_type<'a, 'v: 'a>(mut items: impl Iterator<Item = &'a Typed<'v>>) -> CtyType {
    items.find(|e| !matches!(e.ty, CtyType::Dynamic)).map(|e| e.ty.clone()).unwrap_or(CtyType::Dynamic)
}

fn retyped<'v>(element: Typed<'v>, elem: &CtyType) -> Typed<'v> {
    if matches!(element.ty, CtyType::Dynamic) {
        Typed { ty: elem.clone(), body: Body::Leaf(&NULL) }
    } else {
        element
    }
}

/// JSON for `node` at declared type `t`, as go-cty's JSON encoder writes it (twin of `render` in
/// types.py).
pub fn render(node: &Typed, t: &CtyType, out: &mut Vec<u8>) {
    if let CtyType::Dynamic = t {
        if matches!(node.ty, CtyType::Dynamic) {
            out.extend_from_slice(b"null");
            return;
        }
        out.extend_from_slice(b"{\"type\":");
        node.ty.write_json(out);
        out.extend_from_slice(b",\"value\":");
        render(node, &node.ty, out);
        out.push(b'}');
        return;
    }
    match (&node.body, t) {
        (Body::Leaf(v), _) => write_leaf(out, v),
        (Body::Members(attrs), CtyType::Object(o)) => {
            out.push(b'{');
            for (i, ((_, a), ty)) in attrs.iter().zip(&o.types).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json_keys[i]);
                render(a, ty, out);
            }
            out.push(b'}');
        }
        (Body::Members(pairs), CtyType::Map(e)) => {
            let mut sorted: Vec<(Cow<str>, &Typed)> = pairs.iter().map(|(k, p)| (nfc(Cow::Borrowed(k.as_str())), p)).collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, p)) in sorted.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_string(out, k);
                out.push(b':');
                render(p, e, out);
            }
            out.push(b'}');
        }
        (Body::Items(items), CtyType::Tuple(elems)) => {
            out.push(b'[');
            for (i, (item, ty)) in items.iter().zip(elems).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                render(item, ty, out);
            }
            out.push(b']');
        }
        (Body::Items(items), CtyType::List(e) | CtyType::Set(e)) => {
            let mut texts: Vec<Vec<u8>> = items
                .iter()
                .map(|item| {
                    let mut text = Vec::new();
                    render(item, e, &mut text);
                    text
                })
                .collect();
            if let CtyType::Set(_) = t {
                texts.sort_unstable();
                texts.dedup();
            }
            out.push(b'[');
            for (i, text) in texts.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(text);
            }
            out.push(b']');
        }
        _ => out.extend_from_slice(b"null"), // a shape `typed` does not build
    }
}

/// A value of a type with dynamic in it, written as go-cty writes it (twin of `as_gocty_json` in
/// types.py): at declared type `t`, or with `dynamic` as a dynamic value that came tagged `t`.
pub fn as_gocty_json(v: &JVal, t: &CtyType, dynamic: bool) -> Result<Vec<u8>> {
    let node = typed(v, t)?;
    let mut out = Vec::new();
    render(&node, if dynamic { &CtyType::Dynamic } else { t }, &mut out);
    Ok(out)
}

/// The type a value tagged `t` has in go-cty, and its JSON at that type (twin of `as_own_type`).
pub fn as_own_type(v: &JVal, t: &CtyType) -> Result<(CtyType, Vec<u8>)> {
    let node = typed(v, t)?;
    let mut out = Vec::new();
    render(&node, &node.ty, &mut out);
    Ok((node.ty, out))
}

/// A JSON value written back with numbers in canonical form, as `_leaf_json` in types.py writes
/// it (set elements are ordered by this text).
fn write_leaf(out: &mut Vec<u8>, v: &JVal) {
    write_jval_numbers(out, v, &|out, text| match crate::numbers::parse_number(text) {
        Ok(d) => crate::numbers::canonical_text(&d, out),
        Err(_) => out.extend_from_slice(text),
    });
}
