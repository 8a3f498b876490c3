//! Stop strings: the answer ends just before the first occurrence of any of them, and none of a stop
//! string is ever streamed. Text that could still become the start of one is held back until the
//! next token settles it.

use crate::error::{Error, Result};

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// Scans the streamed answer for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopScan {
    stops: Vec<String>,
    /// The answer so far (cut at the stop string once one is found).
    text: String,
    /// How much of `text` has been released.
    released: usize,
    stopped: bool,
}

impl StopScan {
    /// Refused when there are more than [`MAX_STOP_STRINGS`] or one is empty.
    pub fn new(stops: Vec<String>) -> Result<Self> {
        if stops.len() > MAX_STOP_STRINGS {
            return Err(Error::Invalid(format!(
                "{} stop strings, at most {MAX_STOP_STRINGS}",
                stops.len()
            )));
        }
        if stops.iter().any(String::is_empty) {
            return Err(Error::Invalid("a stop string is empty".into()));
        }
        Ok(Self {
            stops,
            ..Self::default()
        })
    }

    /// Add a token's text; returns the text that may be shown now. After a stop string is found
    /// [`StopScan::stopped`] is true and the rest is ignored.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        // A stop string can only begin where it still overlaps the new piece.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|at| from + at))
            .min();
        let safe = match found {
            Some(at) => {
                self.text.truncate(at);
                self.stopped = true;
                at
            }
            None => self.text.len() - self.held_back(),
        };
        let safe = safe.max(self.released);
        let out = self.text[self.released..safe].to_string();
        self.released = safe;
        out
    }

    /// The longest end of the text that is the beginning of a stop string (held back).
    fn held_back(&self) -> usize {
        let mut held = 0;
        for (at, _) in self.text.char_indices().rev() {
            let tail = &self.text[at..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
            {
                held = tail.len();
            }
            if self.text.len() - at >= self.stops.iter().map(String::len).max().unwrap_or(0) {
                break;
            }
        }
        held
    }

    /// The end of the turn: the text still held back (none when a stop string was found).
    pub fn finish(&mut self) -> String {
        let out = self.text[self.released..].to_string();
        self.released = self.text.len();
        out
    }

    /// A stop string was found.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The answer: everything before the stop string.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, String, bool) {
        let mut s = StopScan::new(stops.iter().map(|s| s.to_string()).collect()).unwrap();
        let mut shown = Vec::new();
        for p in pieces {
            shown.push(s.push(p));
            if s.stopped() {
                break;
            }
        }
        shown.push(s.finish());
        (shown, s.text().to_string(), s.stopped())
    }

    #[test]
    fn cuts_before_a_stop_string_split_over_tokens() {
        let (shown, text, stopped) = run(&["\n\n", "END"], &["Hello", " wor", "ld\n", "\nmore"]);
        assert_eq!(text, "Hello world");
        assert!(stopped);
        assert_eq!(shown.concat(), "Hello world");
        // The newline that might start "\n\n" was held back, then dropped.
        assert_eq!(shown, ["Hello", " wor", "ld", "", ""]);
    }

    #[test]
    fn a_false_start_is_released() {
        let (shown, text, stopped) = run(&["END"], &["a E", "N", "d", " b"]);
        assert!(!stopped);
        assert_eq!(text, "a ENd b");
        assert_eq!(shown, ["a ", "", "ENd", " b", ""]);
    }

    #[test]
    fn without_stops_everything_streams() {
        let (shown, text, _) = run(&[], &["é", "x"]);
        assert_eq!(shown, ["é", "x", ""]);
        assert_eq!(text, "éx");
    }

    #[test]
    fn the_earliest_stop_wins_and_multibyte_is_respected() {
        let (shown, text, stopped) = run(&["éé", "b"], &["aé", "éb"]);
        assert!(stopped);
        assert_eq!(text, "a");
        assert_eq!(shown.concat(), "a");
    }

    #[test]
    fn refuses_bad_lists() {
        assert!(StopScan::new(vec!["a".into(); 5]).is_err());
        assert!(StopScan::new(vec![String::new()]).is_err());
    }
}
