//! Exact decimal numbers as cty keeps them (see kilolock/codec/pure/numbers.py, its twin):
//! `±digits × 10^exp` with no leading or trailing zeros in `digits` (empty means zero).

use std::cmp::Ordering;

pub const EXP_LIMIT: i64 = 1000;
const FLOAT_MAX_FRACTION_DIGITS: i64 = 1074;
const FLOAT_MAX_DIGITS: usize = 800;
const FLOAT_MAX_INT_DIGITS: i64 = 309;
const MAX_POW5_IN_53_BITS: i64 = 22;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dec {
    pub neg: bool,
    pub digits: Vec<u8>, // ASCII '1'..'9' first and last
    pub exp: i64,
}

pub enum Wire {
    Int(i64),
    Float(f64),
    Str(String),
}

pub const NOT_A_NUMBER: &str = "not a decimal number";
pub const OUT_OF_RANGE: &str = "number out of range";

/// Length of the JSON number at the start of `s` (the JSON grammar), or None.
pub fn scan_number(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    if s.first() == Some(&b'-') {
        i += 1;
    }
    match s.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            while matches!(s.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        _ => return None,
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        if !matches!(s.get(i), Some(b'0'..=b'9')) {
            return None;
        }
        while matches!(s.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(s.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !matches!(s.get(i), Some(b'0'..=b'9')) {
            return None;
        }
        while matches!(s.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
    }
    Some(i)
}

/// Parse exactly a JSON number (the whole slice).
pub fn parse_number(s: &[u8]) -> std::result::Result<Dec, &'static str> {
    if scan_number(s) != Some(s.len()) {
        return Err(NOT_A_NUMBER);
    }
    let mut i = 0;
    let neg = s[0] == b'-';
    if neg {
        i = 1;
    }
    let int_start = i;
    while i < s.len() && s[i].is_ascii_digit() {
        i += 1;
    }
    let int_part = &s[int_start..i];
    let mut frac: &[u8] = &[];
    if i < s.len() && s[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
        }
        frac = &s[start..i];
    }
    let mut exp: i64 = 0;
    let mut exp_neg = false;
    let mut exp_digits: &[u8] = &[];
    if i < s.len() && (s[i] == b'e' || s[i] == b'E') {
        i += 1;
        if s[i] == b'+' || s[i] == b'-' {
            exp_neg = s[i] == b'-';
            i += 1;
        }
        exp_digits = &s[i..];
    }
    let mut digits: Vec<u8> = Vec::with_capacity(int_part.len() + frac.len());
    for &c in int_part.iter().chain(frac.iter()) {
        if digits.is_empty() && c == b'0' {
            continue;
        }
        digits.push(c);
    }
    if digits.is_empty() {
        return Ok(Dec { neg: false, digits, exp: 0 });
    }
    let exp_trimmed: &[u8] = {
        let first_nonzero = exp_digits.iter().position(|&c| c != b'0').unwrap_or(exp_digits.len());
        &exp_digits[first_nonzero..]
    };
    if exp_trimmed.len() > 9 {
        return Err(OUT_OF_RANGE);
    }
    for &c in exp_trimmed {
        exp = exp * 10 + (c - b'0') as i64;
    }
    if exp_neg {
        exp = -exp;
    }
    exp -= frac.len() as i64;
    while digits.last() == Some(&b'0') {
        digits.pop();
        exp += 1;
    }
    let adjusted = exp + digits.len() as i64 - 1;
    if !(-EXP_LIMIT..=EXP_LIMIT).contains(&adjusted) {
        return Err(OUT_OF_RANGE);
    }
    Ok(Dec { neg, digits, exp })
}

pub fn from_i128(v: i128) -> Dec {
    parse_number(v.to_string().as_bytes()).expect("integer text is a number")
}

/// go-cty's `Text('f', -1)`: fixed notation, no exponent, no trailing zeros.
pub fn canonical_text(d: &Dec, out: &mut Vec<u8>) {
    if d.digits.is_empty() {
        out.push(b'0');
        return;
    }
    if d.neg {
        out.push(b'-');
    }
    if d.exp >= 0 {
        out.extend_from_slice(&d.digits);
        out.resize(out.len() + d.exp as usize, b'0');
    } else {
        let k = (-d.exp) as usize;
        let n = d.digits.len();
        if n > k {
            out.extend_from_slice(&d.digits[..n - k]);
            out.push(b'.');
            out.extend_from_slice(&d.digits[n - k..]);
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (k - n), b'0');
            out.extend_from_slice(&d.digits);
        }
    }
}

fn canonical_string(d: &Dec) -> String {
    let mut v = Vec::new();
    canonical_text(d, &mut v);
    String::from_utf8(v).expect("ASCII")
}

/// Divide a decimal digit string by a small divisor; returns (quotient, remainder).
fn div_small(digits: &[u8], divisor: u32) -> (Vec<u8>, u32) {
    let mut q = Vec::with_capacity(digits.len());
    let mut rem: u32 = 0;
    for &c in digits {
        let cur = rem * 10 + (c - b'0') as u32;
        let qd = cur / divisor;
        rem = cur % divisor;
        if !(q.is_empty() && qd == 0) {
            q.push(b'0' + qd as u8);
        }
    }
    (q, rem)
}

/// (odd part, number of factors of two) of a decimal digit string, or None if it is zero.
fn split_twos(mut digits: Vec<u8>) -> (Vec<u8>, i64) {
    let mut twos = 0;
    while let Some(&last) = digits.last() {
        if (last - b'0') & 1 == 1 {
            break;
        }
        digits = div_small(&digits, 2).0;
        twos += 1;
    }
    (digits, twos)
}

fn small_value(digits: &[u8]) -> Option<u64> {
    if digits.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in digits {
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

fn bit_len(v: u128) -> i64 {
    128 - v.leading_zeros() as i64
}

fn exact_float(neg: bool, odd: u64, exp2: i64) -> f64 {
    // odd < 2^53 and the exponent is in range: the product is exact.
    let mut f = odd as f64;
    let mut e = exp2;
    while e > 0 {
        let step = e.min(1000);
        f *= 2f64.powi(step as i32);
        e -= step;
    }
    while e < 0 {
        let step = (-e).min(1000);
        f *= 2f64.powi(-(step as i32));
        e += step;
    }
    if neg {
        -f
    } else {
        f
    }
}

/// How go-cty puts the number on the wire (msgpack/marshal.go): int64 range as int, else a value
/// float64 holds exactly as float64, anything else as its decimal text.
pub fn wire_form(d: &Dec) -> Wire {
    if d.digits.is_empty() {
        return Wire::Int(0);
    }
    let n = d.digits.len() as i64;
    if d.exp >= 0 {
        if n + d.exp <= 19 {
            let mut v: i128 = 0;
            for &c in &d.digits {
                v = v * 10 + (c - b'0') as i128;
            }
            for _ in 0..d.exp {
                v *= 10;
            }
            if d.neg {
                v = -v;
            }
            if v >= i64::MIN as i128 && v <= i64::MAX as i128 {
                return Wire::Int(v as i64);
            }
        }
        if d.exp <= MAX_POW5_IN_53_BITS && n + d.exp <= FLOAT_MAX_INT_DIGITS {
            let (odd_digits, twos) = split_twos(d.digits.clone());
            if let Some(odd) = small_value(&odd_digits) {
                let odd = odd as u128 * 5u128.pow(d.exp as u32);
                let exp2 = twos + d.exp;
                if odd < (1u128 << 53) && bit_len(odd) + exp2 <= 1024 {
                    return Wire::Float(exact_float(d.neg, odd as u64, exp2));
                }
            }
        }
        return Wire::Str(canonical_string(d));
    }
    let k = -d.exp;
    // A non-integer dyadic rational always ends in the digit 5 in decimal: cheap early exit.
    if d.digits.last() == Some(&b'5') && k <= FLOAT_MAX_FRACTION_DIGITS && d.digits.len() <= FLOAT_MAX_DIGITS {
        let mut m = d.digits.clone();
        let mut exact = true;
        for _ in 0..k {
            let (q, r) = div_small(&m, 5);
            if r != 0 {
                exact = false;
                break;
            }
            m = q;
        }
        if exact {
            let (odd_digits, twos) = split_twos(m);
            if let Some(odd) = small_value(&odd_digits) {
                let exp2 = twos - k;
                if odd < (1u64 << 53) && exp2 >= -1074 {
                    return Wire::Float(exact_float(d.neg, odd, exp2));
                }
            }
        }
    }
    Wire::Str(canonical_string(d))
}

/// A decoded float64: its shortest round-trip digits in canonical fixed notation.
pub fn float_text(f: f64, out: &mut Vec<u8>) -> std::result::Result<(), &'static str> {
    if !f.is_finite() {
        return Err("number is not finite");
    }
    // Rust's Display for f64 prints the shortest round-trip digits without an exponent.
    let text = format!("{}", f);
    let d = parse_number(text.as_bytes()).map_err(|_| "number is not finite")?;
    canonical_text(&d, out);
    Ok(())
}

/// Exact numeric order (for sets of numbers).
pub fn cmp_dec(a: &Dec, b: &Dec) -> Ordering {
    let sign = |d: &Dec| if d.digits.is_empty() { 0 } else if d.neg { -1 } else { 1 };
    let (sa, sb) = (sign(a), sign(b));
    if sa != sb {
        return sa.cmp(&sb);
    }
    if sa == 0 {
        return Ordering::Equal;
    }
    let mag = cmp_magnitude(a, b);
    if sa < 0 {
        mag.reverse()
    } else {
        mag
    }
}

fn cmp_magnitude(a: &Dec, b: &Dec) -> Ordering {
    let adj_a = a.exp + a.digits.len() as i64;
    let adj_b = b.exp + b.digits.len() as i64;
    if adj_a != adj_b {
        return adj_a.cmp(&adj_b);
    }
    // Same magnitude: compare digit strings left-aligned (shorter padded with zeros).
    let n = a.digits.len().max(b.digits.len());
    for i in 0..n {
        let da = a.digits.get(i).copied().unwrap_or(b'0');
        let db = b.digits.get(i).copied().unwrap_or(b'0');
        if da != db {
            return da.cmp(&db);
        }
    }
    Ordering::Equal
}
