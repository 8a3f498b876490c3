//! GPT-2's byte-to-character table: every byte maps to a printable character, so a vocabulary of
//! strings can hold any byte sequence (`bytes_to_unicode` in OpenAI's `encoder.py`).

use std::sync::LazyLock;

/// byte → the character standing for it.
pub(crate) static BYTE_CHAR: LazyLock<[char; 256]> = LazyLock::new(|| {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            u32::from(b)
        } else {
            n += 1;
            255 + n
        };
        table[usize::from(b)] = char::from_u32(c).unwrap_or('\0');
    }
    table
});

/// The characters of `BYTE_CHAR` all lie below this code point.
pub(crate) const CHAR_LIMIT: usize = 0x144;

/// character (below `CHAR_LIMIT`) → the byte it stands for, or -1.
static CHAR_BYTE: LazyLock<[i16; CHAR_LIMIT]> = LazyLock::new(|| {
    let mut table = [-1i16; CHAR_LIMIT];
    for (b, c) in BYTE_CHAR.iter().enumerate() {
        table[*c as usize] = b as i16;
    }
    table
});

/// Appends the bytes a token stands for, as the ByteLevel decoder does: if every character of the
/// token is a byte character, their bytes; otherwise the token's own UTF-8 bytes.
pub(crate) fn token_to_bytes(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match CHAR_BYTE.get(c as usize).copied() {
            Some(b) if b >= 0 => out.push(b as u8),
            _ => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

/// Appends the byte characters of `text`'s UTF-8 bytes.
pub(crate) fn bytes_to_chars(text: &str, out: &mut String) {
    let table = &*BYTE_CHAR;
    for &b in text.as_bytes() {
        out.push(table[usize::from(b)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection_below_the_limit() {
        let mut seen = std::collections::HashSet::new();
        for c in BYTE_CHAR.iter() {
            assert!((*c as usize) < CHAR_LIMIT);
            assert!(seen.insert(*c));
        }
        assert_eq!(BYTE_CHAR[usize::from(b' ')], 'Ġ');
        assert_eq!(BYTE_CHAR[usize::from(b'\n')], 'Ċ');
    }
}
