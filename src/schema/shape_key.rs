//! The key of a JSON record's shape, read straight off its bytes: the fast path of
//! [`super::infer`].
//!
//! Records of a stream mostly repeat a few shapes, so decoding looks each record's shape up
//! by a key rather than building it: [`scan`] walks the record once, allocating nothing,
//! checking its grammar and writing the key of its shape. Anything the walk cannot settle
//! without building the shape (an array whose elements differ in shape, an escaped key, a
//! number that does not fit its kind, a bad record) makes it give up, and the caller builds
//! the shape with [`super::infer::record_shape`] (which also names what is wrong with a bad
//! record) and writes its key with [`write()`]. Both write the same key for the same shape.
//! A key is only looked up, never kept, unless the builder wrote it: so an object that
//! repeats a key (the builder keeps its last value) is not checked for in the walk; its key
//! names the field twice, which no built shape's does, so the look-up misses and the builder
//! takes the record.
//!
//!
//! ```text
//! long l   double d   string s   boolean b   timestamp t   timestamptz z
//! struct {<fields>}   list [<element>]   field <name length>:<name><type>
//! ```
//!
//! A record's key is its fields' (without braces); the empty shape's is empty.

use super::infer::{Shape, timestamp_kind};

/// Deeper records are left to the shape builder (serde_json stops at 128 levels).
const MAX_DEPTH: usize = 100;

/// Write the key of `record`'s shape to `out` (cleared first); `false` when the record must
/// go through the shape builder instead (`out` is then unspecified). A record repeating a key
/// gets a key no built shape has (see the module's documentation).
pub fn scan(record: &[u8], timestamps: bool, out: &mut Vec<u8>) -> bool {
    out.clear();
    if std::str::from_utf8(record).is_err() {
        return false;
    }
    let mut s = Scanner {
        b: record,
        i: 0,
        timestamps,
        depth: 0,
    };
    s.ws();
    if s.peek() != Some(b'{') {
        return false;
    }
    if s.members(out).is_err() {
        return false;
    }
    s.ws();
    s.i == s.b.len()
}

/// Write the key of a shape with `fields` (a record's, as the shape builder made them).
pub fn write(fields: &[(String, Shape)], out: &mut Vec<u8>) {
    out.clear();
    write_fields(fields, out);
}

fn write_fields(fields: &[(String, Shape)], out: &mut Vec<u8>) {
    for (name, shape) in fields {
        write_name(name.as_bytes(), out);
        write_shape(shape, out);
    }
}

fn write_name(name: &[u8], out: &mut Vec<u8>) {
    // The length's decimal digits, most significant first, without formatting machinery.
    let mut digits = [0u8; 20];
    let mut n = name.len();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.push(b':');
    out.extend_from_slice(name);
}

fn write_shape(shape: &Shape, out: &mut Vec<u8>) {
    match shape {
        Shape::Long => out.push(b'l'),
        Shape::Double => out.push(b'd'),
        Shape::String => out.push(b's'),
        Shape::Boolean => out.push(b'b'),
        Shape::Timestamp(false) => out.push(b't'),
        Shape::Timestamp(true) => out.push(b'z'),
        Shape::Struct(fields) => {
            out.push(b'{');
            write_fields(fields, out);
            out.push(b'}');
        }
        Shape::List(element) => {
            out.push(b'[');
            write_shape(element, out);
            out.push(b']');
        }
    }
}

/// Gave up: the shape builder takes the record.
struct GiveUp;

type Scanned = Result<bool, GiveUp>;

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    timestamps: bool,
    depth: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), GiveUp> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(GiveUp)
        }
    }

    /// One value's shape key; `false` when it has none (null, `[]`, `{}` and containers of
    /// those), having written nothing.
    fn value(&mut self, out: &mut Vec<u8>) -> Scanned {
        self.ws();
        match self.peek().ok_or(GiveUp)? {
            b'{' => {
                let start = out.len();
                out.push(b'{');
                if self.members(out)? {
                    out.push(b'}');
                    Ok(true)
                } else {
                    out.truncate(start);
                    Ok(false)
                }
            }
            b'[' => self.array(out),
            b'"' => {
                let (text, escaped) = self.string()?;
                if self.timestamps {
                    if escaped {
                        return Err(GiveUp);
                    }
                    // Valid UTF-8: the record is, and a string ends at an ASCII quote.
                    let text = std::str::from_utf8(text).map_err(|_| GiveUp)?;
                    if let Some(tz) = timestamp_kind(text) {
                        out.push(if tz { b'z' } else { b't' });
                        return Ok(true);
                    }
                }
                out.push(b's');
                Ok(true)
            }
            b't' => {
                self.literal(b"true")?;
                out.push(b'b');
                Ok(true)
            }
            b'f' => {
                self.literal(b"false")?;
                out.push(b'b');
                Ok(true)
            }
            b'n' => {
                self.literal(b"null")?;
                Ok(false)
            }
            b'-' | b'0'..=b'9' => {
                let kind = self.number()?;
                out.push(kind);
                Ok(true)
            }
            _ => Err(GiveUp),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), GiveUp> {
        if !self.b[self.i..].starts_with(word) {
            return Err(GiveUp);
        }
        self.i += word.len();
        Ok(())
    }

    /// An object from its `{`: its fields' keys, without braces; `false` when no field has a
    /// shape (nothing written).
    fn members(&mut self, out: &mut Vec<u8>) -> Scanned {
        let start = out.len();
        if !self.open(b'}')? {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(GiveUp);
                }
                let (name, escaped) = self.string()?;
                if escaped {
                    return Err(GiveUp);
                }
                self.expect(b':')?;
                let field = out.len();
                write_name(name, out);
                if !self.value(out)? {
                    out.truncate(field);
                }
                if self.closed(b'}')? {
                    break;
                }
            }
        }
        self.depth -= 1;
        Ok(out.len() > start)
    }

    /// An array from its `[`: `[<element>]` when every element with a shape has the same.
    fn array(&mut self, out: &mut Vec<u8>) -> Scanned {
        let start = out.len();
        out.push(b'[');
        let element = out.len();
        let mut element_end = None;
        if !self.open(b']')? {
            loop {
                let this = out.len();
                if self.value(out)? {
                    match element_end {
                        None => element_end = Some(out.len()),
                        Some(end) => {
                            if out[this..] != out[element..end] {
                                return Err(GiveUp);
                            }
                            out.truncate(this);
                        }
                    }
                }
                if self.closed(b']')? {
                    break;
                }
            }
        }
        self.depth -= 1;
        if element_end.is_none() {
            out.truncate(start);
            return Ok(false);
        }
        out.push(b']');
        Ok(true)
    }

    /// Into a container from its opening bracket: whether it closes right away (`end`).
    fn open(&mut self, end: u8) -> Result<bool, GiveUp> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        self.i += 1;
        self.ws();
        let empty = self.peek() == Some(end);
        if empty {
            self.i += 1;
        }
        Ok(empty)
    }

    /// After a container's item: whether the container closed (`end`) or another item
    /// follows (`,`).
    fn closed(&mut self, end: u8) -> Result<bool, GiveUp> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                Ok(false)
            }
            Some(c) if c == end => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(GiveUp),
        }
    }

    /// A string from its opening quote: its raw bytes, and whether it holds escapes.
    fn string(&mut self) -> Result<(&'a [u8], bool), GiveUp> {
        self.i += 1;
        let start = self.i;
        let mut escaped = false;
        loop {
            self.i += plain_bytes(&self.b[self.i..], false);
            let c = *self.b.get(self.i).ok_or(GiveUp)?;
            match c {
                b'"' => {
                    let text = &self.b[start..self.i];
                    self.i += 1;
                    return Ok((text, escaped));
                }
                b'\\' => {
                    escaped = true;
                    match *self.b.get(self.i + 1).ok_or(GiveUp)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6).ok_or(GiveUp)?;
                            let hex = std::str::from_utf8(hex).map_err(|_| GiveUp)?;
                            let unit = u16::from_str_radix(hex, 16).map_err(|_| GiveUp)?;
                            // Surrogate pairs are the shape builder's to check.
                            if (0xD800..0xE000).contains(&unit) {
                                return Err(GiveUp);
                            }
                            self.i += 6;
                        }
                        _ => return Err(GiveUp),
                    }
                }
                0..0x20 => return Err(GiveUp),
                _ => self.i += 1,
            }
        }
    }

    /// A number: `l` for an integer that fits a long, `d` for one with a fraction.
    fn number(&mut self) -> Result<u8, GiveUp> {
        let (end, fraction) = number(self.b, self.i).ok_or(GiveUp)?;
        self.i = end;
        Ok(if fraction { b'd' } else { b'l' })
    }
}

/// The number at `start` of `b`, if the walk settles it: where it ends, and whether it has a
/// fraction (`d`) or is an integer that fits a long (`l`). Any other (an exponent, a larger
/// integer, `-0`, which serde_json reads as a double, leading zeros) is the shape builder's.
pub(crate) fn number(b: &[u8], start: usize) -> Option<(usize, bool)> {
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let negative = b.get(start) == Some(&b'-');
    let first = start + usize::from(negative);
    let whole = digits(first);
    let leading_zero = whole > 0 && b[first] == b'0';
    if whole == 0 || (leading_zero && whole > 1) {
        return None;
    }
    let mut end = first + whole;
    let fraction = b.get(end) == Some(&b'.');
    if fraction {
        let decimals = digits(end + 1);
        if whole > 18 || decimals == 0 {
            return None;
        }
        end += 1 + decimals;
    } else if negative && leading_zero {
        return None;
    } else if whole > 18 {
        // Digits only, and a sign: ASCII.
        let text = std::str::from_utf8(&b[start..end]).ok()?;
        text.parse::<i64>().ok()?;
    }
    match b.get(end) {
        Some(b'e' | b'E') => None,
        _ => Some((end, fraction)),
    }
}

/// How many bytes `text` starts with that a string holds as they are: no quote, no backslash,
/// no control character (and, when `ascii`, no byte of a character of several). Eight at a
/// time: a byte is flagged when it equals `"` or `\\` (XOR leaves it zero) or is below 0x20
/// (or has its high bit set); the lowest flagged byte of a word is exact (the borrows that may
/// flag bytes above it start there).
pub(crate) fn plain_bytes(text: &[u8], ascii: bool) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Bytes below `n` (those with their high bit clear), flagged in their high bit.
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * n as u64) & !word & HIGHS;
    let mut at = 0;
    while let Some(chunk) = text.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let flagged = below(word ^ (ONES * b'"' as u64), 1)
            | below(word ^ (ONES * b'\\' as u64), 1)
            | below(word, 0x20)
            | if ascii { word & HIGHS } else { 0 };
        if flagged != 0 {
            return at + flagged.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    at + text[at..]
        .iter()
        .take_while(|&&c| c != b'"' && c != b'\\' && c >= 0x20 && (!ascii || c < 0x80))
        .count()
}

#[cfg(test)]
mod tests {
    use super::super::infer::record_shape;
    use super::*;

    /// The scanned key, and the key of the shape the builder makes, for `json`.
    fn keys(json: &str, timestamps: bool) -> (Option<String>, Option<String>) {
        let mut out = Vec::new();
        let fast = scan(json.as_bytes(), timestamps, &mut out)
            .then(|| String::from_utf8(out.clone()).unwrap());
        let slow = record_shape(json.as_bytes(), timestamps)
            .ok()
            .map(|fields| {
                write(&fields, &mut out);
                String::from_utf8(out.clone()).unwrap()
            });
        (fast, slow)
    }

    #[test]
    fn scanned_keys_are_the_built_shapes_keys() {
        let records = [
            r#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": false}"#,
            r#" {"o": {"x": [1, 2], "y": {"z": null}}, "l": [{"a": 1}, {"a": 2}]} "#,
            r#"{"a": null, "b": [], "c": {}, "d": {"x": null}, "e": [null, []], "f": -0.5}"#,
            r#"{}"#,
            r#"{"nested": [[1, 2], [], [3]], "s": "plain"}"#,
            r#"{"big": 123456789012345678, "bigger": -9223372036854775808}"#,
            r#"{"t": "2024-05-01T10:00:00Z", "n": "2024-05-01 10:00:00.5", "s": "2024-05-01"}"#,
            r#"{"ünï": "cödé", "10": 10}"#,
        ];
        for r in records {
            for ts in [false, true] {
                let (fast, slow) = keys(r, ts);
                assert!(fast.is_some(), "{r} was not scanned");
                assert_eq!(fast, slow, "{r}");
            }
        }
        // Escapes in values (read as timestamps, they are the builder's).
        let escaped = r#"{"s": "a \"quoted\" \u00e9 \n word", "l": ["\t", "x"]}"#;
        let (fast, slow) = keys(escaped, false);
        assert!(fast.is_some());
        assert_eq!(fast, slow);
        let wide: Vec<String> = (0..40).map(|i| format!("\"k{i}\": {i}")).collect();
        let wide = format!("{{{}}}", wide.join(", "));
        let (fast, slow) = keys(&wide, false);
        assert!(fast.is_some());
        assert_eq!(fast, slow);
        assert_eq!(
            keys("{\"a\": 1, \"b\": \"x\"}", false).0.unwrap(),
            "1:al1:bs"
        );
        let long = "n".repeat(1234);
        let record = format!("{{\"{long}\": 0, \"\": 1.5}}");
        assert_eq!(keys(&record, false).0.unwrap(), format!("1234:{long}l0:d"));
    }

    #[test]
    fn a_repeated_key_scans_to_a_key_no_built_shape_has() {
        let wide: Vec<String> = (0..40).map(|i| format!("\"k{i}\": {i}")).collect();
        let repeated_wide = format!("{{{}, \"k3\": \"x\"}}", wide.join(", "));
        for r in [
            r#"{"a": 1, "a": "x"}"#,
            r#"{"a": 1, "a": 2}"#,
            r#"{"o": {"a": 1, "b": null, "a": null}}"#,
            r#"{"l": [{"a": 1, "a": 2}]}"#,
            repeated_wide.as_str(),
        ] {
            let (fast, slow) = keys(r, false);
            let (fast, slow) = (fast.expect("scanned"), slow.expect("built"));
            assert_ne!(fast, slow, "{r}");
        }
    }

    #[test]
    fn plain_bytes_stop_at_quotes_backslashes_and_control_characters() {
        let naive = |t: &[u8], ascii: bool| {
            t.iter()
                .take_while(|&&c| c != b'"' && c != b'\\' && c >= 0x20 && (!ascii || c < 0x80))
                .count()
        };
        let mut texts: Vec<Vec<u8>> = vec![Vec::new(), b"plain".to_vec()];
        let stops = [b'"', b'\\', 0x00, 0x1f, b'\n'];
        let fillers = [b'a', b' ', b'!', b'#', b'[', 0x7f, 0x80, 0xc3, 0xff, 0x21];
        for len in 0..20 {
            for &fill in &fillers {
                texts.push(vec![fill; len]);
                for at in 0..len {
                    for &stop in &stops {
                        let mut t = vec![fill; len];
                        t[at] = stop;
                        texts.push(t.clone());
                        // A byte just below a flagged one borrows from it: later stops too.
                        if at + 1 < len {
                            t[at + 1] = 0x01;
                            texts.push(t);
                        }
                    }
                }
            }
        }
        for t in &texts {
            for ascii in [false, true] {
                assert_eq!(plain_bytes(t, ascii), naive(t, ascii), "{t:?} {ascii}");
            }
        }
    }

    #[test]
    fn what_needs_the_shape_builder_is_left_to_it() {
        let records = [
            r#"{"l": [1, 2.5]}"#,
            r#"{"l": [{"a": 1}, {"b": "s"}]}"#,
            r#"{"k\u0041": 1}"#,
            r#"{"e": 1e3}"#,
            r#"{"z": -0}"#,
            r#"{"huge": 18446744073709551615}"#,
            r#"{"huger": 123456789012345678901234567890}"#,
            r#"{"t": "2024-05-01T10:00:\u00300Z"}"#,
        ];
        for r in records {
            let (fast, slow) = keys(r, true);
            assert_eq!(fast, None, "{r} was scanned");
            let _ = slow;
        }
        // Bad records too: the builder says what is wrong with them.
        for bad in [
            "",
            "  ",
            "[1]",
            r#"{"a": 1} {"b": 2}"#,
            r#"{"a": "#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": tru}"#,
            "{\"a\": \"tab\there\"}",
            r#"{"a": "\x"}"#,
            r#"{"a": 1,}"#,
        ] {
            let (fast, slow) = keys(bad, false);
            assert_eq!(fast, None, "{bad} was scanned");
            assert_eq!(slow, None, "{bad} was built");
        }
        let deep = format!("{{\"a\": {}1{}}}", "[".repeat(150), "]".repeat(150));
        assert_eq!(keys(&deep, false).0, None);
    }
}
