//! The JSON mask (GUIDE: "Output set to JSON keeps the completion inside a JSON value, using the top
//! 40 tokens"): after the lm_head, only tokens among the 40 most likely whose bytes keep the
//! completion a prefix of one JSON value (RFC 8259) may be chosen; the turn ends when the value is
//! complete. The hidden state is finished before the mask, so it changes no bit of any stage.
//!
//! The value is an object or an array (as JSON modes elsewhere ask, e.g. llama.cpp's JSON grammar):
//! a bare scalar lets a model that wanted to write prose answer `1.1111…`, which no user asking for
//! JSON output means.

/// Candidates the mask considers at each step: the most likely tokens by logit.
pub const JSON_TOP_K: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Number {
    /// Whether the digits so far form a whole number (a delimiter may end it here).
    fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::Exp
        )
    }

    fn next(self, b: u8) -> Option<Number> {
        use Number::*;
        Some(match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') => Int,
            (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => E,
            (E, b'+' | b'-') => ESign,
            (E | ESign | Exp, b'0'..=b'9') => Exp,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value (leading whitespace allowed).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,`, a closer, or (at the top level) only whitespace.
    After,
    /// Inside a string; `escape` counts what the escape still needs (1 after `\`, 1..=4 hex digits).
    Str {
        key: bool,
        escape: u8,
        hex: bool,
    },
    Num(Number),
    /// Inside `true`, `false` or `null`: the word and the bytes matched.
    Literal(&'static [u8], usize),
}

/// A prefix of one JSON value, fed byte by byte.
#[derive(Clone, Debug)]
pub struct JsonPrefix {
    stack: Vec<Container>,
    state: State,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        Self::new()
    }
}

fn ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonPrefix {
    pub fn new() -> Self {
        Self {
            stack: Vec::new(),
            state: State::Value,
        }
    }

    /// Whether one whole value has been read (trailing whitespace allowed, nothing else). A number
    /// at the top level is whole only once a delimiter (whitespace) ends it: "1" may become "12".
    pub fn complete(&self) -> bool {
        self.stack.is_empty() && self.state == State::After
    }

    /// Whether the bytes so far are one whole value if the input ends here (a top-level number
    /// counts), as a JSON parser reading them would decide.
    pub fn whole_at_end(&self) -> bool {
        self.complete()
            || (self.stack.is_empty() && matches!(self.state, State::Num(n) if n.complete()))
    }

    /// Feed `bytes`; `false` (state unspecified) when they cannot continue a JSON value.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.byte(b))
    }

    /// [`Self::feed`] where the top-level value must be an object or an array.
    pub fn feed_container(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| {
            let top = self.stack.is_empty() && self.state == State::Value;
            (!top || matches!(b, b'{' | b'[') || ws(b)) && self.byte(b)
        })
    }

    fn start_value(&mut self, b: u8) -> bool {
        self.state = match b {
            b'{' => {
                self.stack.push(Container::Object);
                State::KeyOrClose
            }
            b'[' => {
                self.stack.push(Container::Array);
                State::ValueOrClose
            }
            b'"' => State::Str {
                key: false,
                escape: 0,
                hex: false,
            },
            b'-' => State::Num(Number::Minus),
            b'0' => State::Num(Number::Zero),
            b'1'..=b'9' => State::Num(Number::Int),
            b't' => State::Literal(b"true", 1),
            b'f' => State::Literal(b"false", 1),
            b'n' => State::Literal(b"null", 1),
            _ => return false,
        };
        true
    }

    fn close(&mut self, c: Container) -> bool {
        if self.stack.last() != Some(&c) {
            return false;
        }
        self.stack.pop();
        self.state = State::After;
        true
    }

    fn byte(&mut self, b: u8) -> bool {
        match self.state {
            State::Value if ws(b) => true,
            State::Value => self.start_value(b),
            State::ValueOrClose if ws(b) => true,
            State::ValueOrClose if b == b']' => self.close(Container::Array),
            State::ValueOrClose => self.start_value(b),
            State::KeyOrClose | State::Key if ws(b) => true,
            State::KeyOrClose if b == b'}' => self.close(Container::Object),
            State::KeyOrClose | State::Key if b == b'"' => {
                self.state = State::Str {
                    key: true,
                    escape: 0,
                    hex: false,
                };
                true
            }
            State::KeyOrClose | State::Key => false,
            State::Colon if ws(b) => true,
            State::Colon if b == b':' => {
                self.state = State::Value;
                true
            }
            State::Colon => false,
            State::After if ws(b) => true,
            State::After => match (b, self.stack.last()) {
                (b',', Some(Container::Object)) => {
                    self.state = State::Key;
                    true
                }
                (b',', Some(Container::Array)) => {
                    self.state = State::Value;
                    true
                }
                (b'}', _) => self.close(Container::Object),
                (b']', _) => self.close(Container::Array),
                _ => false,
            },
            State::Str { key, escape, hex } => {
                self.state = match (escape, hex, b) {
                    (0, _, b'"') if key => State::Colon,
                    (0, _, b'"') => State::After,
                    (0, _, b'\\') => State::Str {
                        key,
                        escape: 1,
                        hex: false,
                    },
                    (0, _, 0x00..=0x1f) => return false,
                    (0, _, _) => return true,
                    (1, false, b'u') => State::Str {
                        key,
                        escape: 4,
                        hex: true,
                    },
                    (1, false, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        State::Str {
                            key,
                            escape: 0,
                            hex: false,
                        }
                    }
                    (n, true, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => State::Str {
                        key,
                        escape: n - 1,
                        hex: n > 1,
                    },
                    _ => return false,
                };
                true
            }
            State::Num(n) => match n.next(b) {
                Some(next) => {
                    self.state = State::Num(next);
                    true
                }
                // A delimiter ends a whole number and is read as what follows the value.
                None if n.complete() => {
                    self.state = State::After;
                    self.byte(b)
                }
                None => false,
            },
            State::Literal(word, at) => {
                if word.get(at) != Some(&b) {
                    return false;
                }
                self.state = if at + 1 == word.len() {
                    State::After
                } else {
                    State::Literal(word, at + 1)
                };
                true
            }
        }
    }
}

/// The mask over a vocabulary: each id's bytes (`None` for added tokens, never allowed) and the
/// object or array read so far.
#[derive(Clone, Debug)]
pub struct JsonMask {
    tokens: Vec<Option<Vec<u8>>>,
    prefix: JsonPrefix,
}

impl JsonMask {
    /// `tokens[id]`: the bytes of token `id`, or `None` for a token that may never be chosen.
    pub fn new(tokens: Vec<Option<Vec<u8>>>) -> Self {
        Self {
            tokens,
            prefix: JsonPrefix::new(),
        }
    }

    /// Whether `id` may come next: it has bytes, and they continue the value (never past its end).
    pub fn allows(&self, id: u32) -> bool {
        let Some(Some(bytes)) = self.tokens.get(id as usize) else {
            return false;
        };
        if bytes.is_empty() || (self.prefix.complete() && !bytes.iter().all(|&b| ws(b))) {
            return false;
        }
        self.prefix.clone().feed_container(bytes)
    }

    /// Take `id` as chosen (it must be allowed).
    pub fn accept(&mut self, id: u32) {
        if let Some(Some(bytes)) = self.tokens.get(id as usize) {
            let ok = self.prefix.feed_container(bytes);
            debug_assert!(ok, "accepted a token the mask refuses");
        }
    }

    /// Whether the completion is one whole JSON value.
    pub fn complete(&self) -> bool {
        self.prefix.complete()
    }
}

/// The ids of the `k` largest logits, largest first (ties: the lower id first).
pub(crate) fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let by = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if ids.len() > k {
        ids.select_nth_unstable_by(k, by);
        ids.truncate(k);
    }
    ids.sort_unstable_by(by);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(s: &str) -> bool {
        let mut p = JsonPrefix::new();
        p.feed(s.as_bytes()) && p.whole_at_end()
    }

    fn prefix_ok(s: &str) -> bool {
        JsonPrefix::new().feed(s.as_bytes())
    }

    /// Documents checked against `serde_json` (the independent oracle): a document is complete for
    /// us exactly when serde_json parses it, and every prefix of a valid one is accepted.
    const DOCS: &[&str] = &[
        r#"{"a": [1, 2.5, -3e+7, true, false, null], "b": {"c": "d\"\\\/\b\f\n\r\t\u00e9"}}"#,
        r#"[]"#,
        r#"{}"#,
        r#"  "plain string"  "#,
        "0",
        "-0.5E-3",
        r#"[{"x": []}, [[]], "é", 12]"#,
        r#"{"a" : 1 , "b":2}"#,
        r#"{"a": 01}"#,
        r#"{"a": 1,}"#,
        r#"[1 2]"#,
        r#"{"a" 1}"#,
        r#"{1: 2}"#,
        r#"[1.]"#,
        r#"[-]"#,
        r#"["\x"]"#,
        r#"["\u12G4"]"#,
        "[tru]",
        "[nul, 1]",
        "{\"a\": \"line\nbreak\"}",
        r#"{"a": [1}"#,
        r#"[1]]"#,
        r#"{"a": 1} {"#,
        r#"[1}"#,
        r#"{"a": 1]"#,
    ];

    /// JSON strings may not hold an unescaped U+0000–U+001F: every one of them, raw inside a string,
    /// is refused as serde_json refuses it, and its escaped form is accepted as serde_json accepts it.
    #[test]
    fn raw_control_characters_in_strings_are_refused_like_serde_json() {
        for c in 0u8..0x20 {
            let raw = format!("{{\"a\": \"x{}y\"}}", c as char);
            let oracle = serde_json::from_str::<serde_json::Value>(&raw).is_ok();
            assert!(!oracle, "serde_json accepts raw {c:#04x}");
            assert!(
                !prefix_ok(&raw),
                "raw {c:#04x} inside a string was accepted"
            );
            let escaped = format!("{{\"a\": \"x\\u{c:04x}y\"}}");
            assert!(serde_json::from_str::<serde_json::Value>(&escaped).is_ok());
            assert!(whole(&escaped), "{escaped:?} refused");
        }
        // Mask level: a token whose bytes put a raw newline inside a string is never allowed, its
        // escaped spelling is.
        let tokens = vec![
            Some(b"{\"a\": \"x".to_vec()),
            Some(b"\n".to_vec()),
            Some(b"\\n".to_vec()),
        ];
        let mut mask = JsonMask::new(tokens);
        mask.accept(0);
        assert!(!mask.allows(1));
        assert!(mask.allows(2));
    }

    #[test]
    fn complete_exactly_when_serde_json_parses() {
        for doc in DOCS {
            let oracle = serde_json::from_str::<serde_json::Value>(doc).is_ok();
            assert_eq!(whole(doc), oracle, "{doc:?}: serde_json says {oracle}");
            if oracle {
                for end in 0..=doc.len() {
                    if doc.is_char_boundary(end) {
                        assert!(prefix_ok(&doc[..end]), "prefix {:?} refused", &doc[..end]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_documents_catch_a_checker_that_ignores_bracket_kinds() {
        // Mutation: the same automaton with `}` and `]` interchangeable must disagree with serde_json
        // on some document, or the table could not tell it from the real one.
        let lenient = |s: &str| {
            let mut p = JsonPrefix::new();
            s.bytes().all(|b| {
                let b = match (b, p.stack.last()) {
                    (b'}', Some(Container::Array)) => b']',
                    (b']', Some(Container::Object)) => b'}',
                    _ => b,
                };
                p.byte(b)
            }) && p.whole_at_end()
        };
        let caught = DOCS
            .iter()
            .filter(|d| lenient(d) != serde_json::from_str::<serde_json::Value>(d).is_ok())
            .count();
        assert!(caught > 0);
    }

    #[test]
    fn the_mask_allows_only_continuations_and_stops_at_the_end() {
        let vocab: Vec<Option<Vec<u8>>> = [
            Some(&b"{\""[..]),
            Some(b"key"),
            Some(b"\":"),
            Some(b" 12"),
            Some(b"}"),
            Some(b"Hello"),
            None,
            Some(b""),
            Some(b" "),
            Some(b"7"),
            Some(b"\"s\""),
        ]
        .into_iter()
        .map(|t| t.map(<[u8]>::to_vec))
        .collect();
        let mut m = JsonMask::new(vocab);
        assert!(m.allows(0) && !m.allows(5) && !m.allows(6) && !m.allows(7) && !m.allows(4));
        // A bare scalar is a JSON value, but not the object or array the mask asks for.
        assert!(!m.allows(9) && !m.allows(10) && m.allows(8));
        for id in [0, 1, 2, 3] {
            assert!(m.allows(id), "id {id}");
            m.accept(id);
        }
        // Inside the number: `}` ends it and the object; " 12" would be a second number.
        assert!(!m.complete() && m.allows(4) && m.allows(8) && !m.allows(3) && !m.allows(0));
        m.accept(4);
        assert!(m.complete());
        assert!(m.allows(8) && !m.allows(4) && !m.allows(3));
    }

    #[test]
    fn top_k_orders_by_logit_then_id() {
        let logits = [0.5, 2.0, 2.0, -1.0, 3.0];
        assert_eq!(top_k(&logits, 3), vec![4, 1, 2]);
        assert_eq!(top_k(&logits, 10), vec![4, 1, 2, 0, 3]);
    }
}
