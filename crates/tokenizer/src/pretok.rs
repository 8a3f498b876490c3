//! Pre-tokenizers: ByteLevel (with and without GPT-2's regex, with and without a prefix space),
//! Split (a pattern and a behavior), Digits, applied in sequence as `tokenizers` applies them.

use std::sync::LazyLock;

use crate::bytelevel;
use crate::pattern::{GPT2_REGEX, Pattern};

/// What `Split` does with the matches (`SplitDelimiterBehavior` in `tokenizers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

#[derive(Debug)]
pub(crate) enum PreTokenizer {
    ByteLevel {
        add_prefix_space: bool,
        use_regex: bool,
    },
    Split {
        pattern: Pattern,
        behavior: Behavior,
        invert: bool,
    },
    Digits {
        individual: bool,
    },
}

static GPT2: LazyLock<Option<Pattern>> = LazyLock::new(|| Pattern::regex(GPT2_REGEX).ok());

/// Runs `text` through the pre-tokenizers and calls `emit` on every non-empty word.
pub(crate) fn pre_tokenize(pts: &[PreTokenizer], text: String, emit: &mut dyn FnMut(&str)) {
    if text.is_empty() {
        return;
    }
    run(pts, &text, emit);
}

fn run(pts: &[PreTokenizer], piece: &str, emit: &mut dyn FnMut(&str)) {
    let Some((first, rest)) = pts.split_first() else {
        emit(piece);
        return;
    };
    match first {
        PreTokenizer::ByteLevel {
            add_prefix_space,
            use_regex,
        } => {
            let owned;
            let s = if *add_prefix_space && !piece.starts_with(' ') {
                owned = format!(" {piece}");
                owned.as_str()
            } else {
                piece
            };
            let mut buf = String::with_capacity(s.len() * 2);
            let mut map = |part: &str| {
                if part.is_empty() {
                    return;
                }
                buf.clear();
                bytelevel::bytes_to_chars(part, &mut buf);
                run(rest, &buf, emit);
            };
            if *use_regex {
                let ranges = split(
                    GPT2.as_ref().map(Pieces::Regex),
                    s,
                    Behavior::Isolated,
                    false,
                );
                for (a, b) in ranges {
                    map(&s[a..b]);
                }
            } else {
                map(s);
            }
        }
        PreTokenizer::Split {
            pattern,
            behavior,
            invert,
        } => {
            for (a, b) in split(Some(Pieces::Regex(pattern)), piece, *behavior, *invert) {
                if a < b {
                    run(rest, &piece[a..b], emit);
                }
            }
        }
        PreTokenizer::Digits { individual } => {
            let behavior = if *individual {
                Behavior::Isolated
            } else {
                Behavior::Contiguous
            };
            for (a, b) in split(Some(Pieces::Numeric), piece, behavior, false) {
                if a < b {
                    run(rest, &piece[a..b], emit);
                }
            }
        }
    }
}

/// Where the matches of a split come from.
enum Pieces<'a> {
    Regex(&'a Pattern),
    /// Every `char::is_numeric` character is a match of its own (a `Fn(char) -> bool` pattern).
    Numeric,
}

fn find_matches(pieces: Option<Pieces<'_>>, text: &str, invert: bool) -> Vec<(usize, usize, bool)> {
    let mut out = Vec::new();
    match pieces {
        Some(Pieces::Regex(p)) => {
            p.for_each_range(text, &mut |a, b, m| out.push((a, b, m != invert)))
        }
        Some(Pieces::Numeric) => {
            if text.is_empty() {
                out.push((0, 0, invert));
                return out;
            }
            let mut last = 0;
            for (i, c) in text.char_indices() {
                if c.is_numeric() {
                    if last < i {
                        out.push((last, i, invert));
                    }
                    out.push((i, i + c.len_utf8(), !invert));
                    last = i + c.len_utf8();
                }
            }
            if last < text.len() {
                out.push((last, text.len(), invert));
            }
        }
        None => out.push((0, text.len(), invert)),
    }
    out
}

/// The ranges `NormalizedString::split` keeps, in order.
fn split(
    pieces: Option<Pieces<'_>>,
    text: &str,
    behavior: Behavior,
    invert: bool,
) -> Vec<(usize, usize)> {
    let matches = find_matches(pieces, text, invert);
    let mut acc: Vec<(usize, usize)> = Vec::with_capacity(matches.len());
    match behavior {
        Behavior::Isolated => acc.extend(matches.iter().map(|&(a, b, _)| (a, b))),
        Behavior::Removed => acc.extend(matches.iter().filter(|m| !m.2).map(|&(a, b, _)| (a, b))),
        Behavior::Contiguous => {
            let mut previous = false;
            for &(a, b, is_match) in &matches {
                match acc.last_mut() {
                    Some(last) if is_match == previous => last.1 = b,
                    _ => acc.push((a, b)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithPrevious => {
            let mut previous = false;
            for &(a, b, is_match) in &matches {
                match acc.last_mut() {
                    Some(last) if is_match && !previous => last.1 = b,
                    _ => acc.push((a, b)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithNext => {
            let mut previous = false;
            for &(a, b, is_match) in matches.iter().rev() {
                match acc.last_mut() {
                    Some(last) if is_match && !previous => last.0 = a,
                    _ => acc.push((a, b)),
                }
                previous = is_match;
            }
            acc.reverse();
        }
    }
    acc
}
