//! The shared vector file (tests/codec/vectors.json, also run by pytest against both backends).

use _native::{compile, marshal, unmarshal};
use serde_json::Value;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{:02x}", x)).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn type_bytes(v: &Value) -> Vec<u8> {
    match v.get("type_text") {
        Some(t) => t.as_str().unwrap().as_bytes().to_vec(),
        None => serde_json::to_vec(&v["type"]).unwrap(),
    }
}

fn json_input(v: &Value) -> Vec<u8> {
    match v.get("json_hex") {
        Some(h) => unhex(h.as_str().unwrap()),
        None => v["json"].as_str().unwrap().as_bytes().to_vec(),
    }
}

#[test]
fn shared_vectors() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/codec/vectors.json");
    let text = std::fs::read_to_string(path).expect("tests/codec/vectors.json");
    let vectors: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert!(vectors.len() > 100);
    let mut failures = Vec::new();
    for v in &vectors {
        let name = v["name"].as_str().unwrap();
        let compiled = compile(&type_bytes(v));
        if let Some(err) = v.get("error").and_then(Value::as_str) {
            let result = if v.get("type_text").is_some() {
                compiled.map(|_| Vec::new())
            } else {
                let ty = compiled.expect(name);
                if v.get("msgpack").is_some() {
                    unmarshal::decode(&unhex(v["msgpack"].as_str().unwrap()), &ty)
                } else {
                    marshal::encode(&json_input(v), &ty)
                }
            };
            match result {
                // "error" is the message's start: the exact path, then what is wrong.
                Err(e) if e.render().starts_with(err) => {}
                other => failures.push(format!("{}: expected error {:?}, got {:?}", name, err, other.map(|b| hex(&b)))),
            }
            continue;
        }
        let ty = compiled.unwrap_or_else(|e| panic!("{}: {}", name, e.render()));
        let wire = unhex(v["msgpack"].as_str().unwrap());
        if v.get("json").is_some() {
            match marshal::encode(&json_input(v), &ty) {
                Ok(b) if b == wire => {}
                other => failures.push(format!("{}: encode gave {:?}", name, other.map(|b| hex(&b)))),
            }
        }
        match unmarshal::decode(&wire, &ty) {
            Ok(b) if b == v["canonical"].as_str().unwrap().as_bytes() => {}
            other => failures.push(format!("{}: decode gave {:?}", name, other.map(|b| String::from_utf8_lossy(&b).into_owned()))),
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
