//! Exact decimal numbers as cty keeps them (see kilolock/codec/pure/numbers.py, its twin):
//! `±digits × 10^exp` with no leading or trailing zeros in `digits` (empty means zero).

use std::cmp::Ordering;

pub const EXP_LIMIT: i64 = 1000;
const FLOAT_MAX_FRACTION_DIGITS: i64 = 1074;
const FLOAT_MAX_DIGITS: usize = 800;

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
        // go-cty keeps a zero's sign (big.Float) and writes it: "-0" stays "-0".
        return Ok(Dec { neg, digits, exp: 0 });
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
        out.extend_from_slice(if d.neg { b"-0" } else { b"0" });
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

/// How go-cty puts the number on the wire (msgpack/marshal.go): int64 range as int, else a
/// non-integer float64 holds exactly as float64, anything else as its decimal text.
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
        // Beyond int64 an integer goes as its decimal text even where float64 holds it exactly
        // (2^64, 1e20): go-cty v1.16 (Terraform 1.12) sends only non-integers as float64.
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

/// `odd × 2^exp2` exactly, as math/big's `decimal` holds it: digits without trailing zeros and
/// the decimal point's position (value = 0.digits × 10^point).
fn decimal_digits(odd: u64, exp2: i64) -> (Vec<u8>, i64) {
    const BASE: u64 = 1_000_000_000;
    let mut limbs: Vec<u64> = Vec::with_capacity(8); // base 1e9, least significant first
    let mut v = odd;
    while v > 0 {
        limbs.push(v % BASE);
        v /= BASE;
    }
    let mul = |limbs: &mut Vec<u64>, k: u64| {
        let mut carry = 0u64;
        for limb in limbs.iter_mut() {
            let x = *limb * k + carry; // limb < 1e9 and k < 2^32: fits
            *limb = x % BASE;
            carry = x / BASE;
        }
        while carry > 0 {
            limbs.push(carry % BASE);
            carry /= BASE;
        }
    };
    let (mut left, step, factor) = if exp2 >= 0 { (exp2, 31, 1u64 << 31) } else { (-exp2, 13, 1_220_703_125u64) };
    while left > 0 {
        let k = left.min(step);
        let f = if k == step { factor } else if exp2 >= 0 { 1u64 << k } else { 5u64.pow(k as u32) };
        mul(&mut limbs, f);
        left -= k;
    }
    let mut text: Vec<u8> = Vec::with_capacity(limbs.len() * 9);
    for (i, limb) in limbs.iter().rev().enumerate() {
        if i == 0 {
            text.extend_from_slice(limb.to_string().as_bytes());
        } else {
            text.extend_from_slice(format!("{:09}", limb).as_bytes());
        }
    }
    let point = text.len() as i64 + exp2.min(0);
    while text.last() == Some(&b'0') {
        text.pop();
    }
    (text, point)
}

fn round_up(digits: &mut Vec<u8>, point: &mut i64, mut n: usize) {
    while n > 0 && digits[n - 1] == b'9' {
        n -= 1;
    }
    if n == 0 {
        digits.clear();
        digits.push(b'1');
        *point += 1;
        return;
    }
    digits[n - 1] += 1;
    digits.truncate(n);
}

fn round_down(digits: &mut Vec<u8>, point: &mut i64, n: usize) {
    digits.truncate(n);
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    if digits.is_empty() {
        *point = 0;
    }
}

/// The digits Go's `big.Float.Text('f', -1)` writes for `m53 × 2^exp2` held at 53-bit precision
/// (`m53` in [2^52, 2^53)), by math/big's `roundShortest` (see float_text in numbers.py for the
/// rule's quirks).
fn shortest_at_53_bits(m53: u64, exp2: i64) -> (Vec<u8>, i64) {
    let (mut digits, mut point) = decimal_digits(m53, exp2);
    let (lower, _) = decimal_digits(2 * m53 - 1, exp2 - 1);
    let (upper, _) = decimal_digits(2 * m53 + 1, exp2 - 1);
    let inclusive = m53.is_multiple_of(2);
    for i in 0..digits.len() {
        let m = digits[i];
        let low = lower.get(i).copied().unwrap_or(b'0');
        let up = upper.get(i).copied().unwrap_or(b'0');
        let mut ok_down = low != m || (inclusive && i + 1 == lower.len());
        let ok_up = m != up && (inclusive || m + 1 < up || i + 1 < upper.len());
        let n = i + 1;
        if n >= digits.len() {
            break; // math/big's round* leave a decimal alone at or past its end
        }
        if ok_down && ok_up {
            ok_down = if digits[n] == b'5' && n + 1 == digits.len() {
                (digits[n - 1] - b'0').is_multiple_of(2)
            } else {
                digits[n] < b'5'
            };
            if ok_down {
                round_down(&mut digits, &mut point, n);
            } else {
                round_up(&mut digits, &mut point, n);
            }
            break;
        }
        if ok_down {
            round_down(&mut digits, &mut point, n);
            break;
        }
        if ok_up {
            round_up(&mut digits, &mut point, n);
            break;
        }
    }
    (digits, point)
}

const TWO_53: f64 = 9_007_199_254_740_992.0;

/// A decoded float64 as Terraform writes it: go-cty's `NumberFloatVal` holds it as a `big.Float`
/// of 53-bit precision and state gets its `Text('f', -1)` (twin of float_text in numbers.py).
pub fn float_text(f: f64, out: &mut Vec<u8>) -> std::result::Result<(), &'static str> {
    if !f.is_finite() {
        return Err("number is not finite");
    }
    if f == 0.0 {
        out.extend_from_slice(if f.is_sign_negative() { b"-0" } else { b"0" });
        return Ok(());
    }
    if f.fract() == 0.0 && (-TWO_53..=TWO_53).contains(&f) {
        // An ulp of at most 1 (2 at 2^53): only the integer itself fits.
        out.extend_from_slice((f as i64).to_string().as_bytes());
        return Ok(());
    }
    let bits = f.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let frac = bits & ((1u64 << 52) - 1);
    let (mut m, mut exp2) = if biased == 0 { (frac, -1074) } else { (frac | (1u64 << 52), biased - 1075) };
    let shift = m.leading_zeros() as i64 - 11; // normalise subnormals to 53 bits, as big.Float does
    m <<= shift;
    exp2 -= shift;
    let (digits, point) = shortest_at_53_bits(m, exp2);
    let exp = point - digits.len() as i64;
    canonical_text(&Dec { neg: f < 0.0, digits, exp }, out);
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
