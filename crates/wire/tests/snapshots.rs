//! Snapshots of the encoded bytes of every message type: the wire format is pinned, and any change to
//! it shows up in review (`cargo insta review`). CI never updates them (`CI=true` makes insta refuse).

use daisy_wire::{decode, encode};

use crate::samples;

fn hex_lines(bytes: &[u8]) -> String {
    let mut out = format!("{} bytes\n", bytes.len());
    for line in bytes.chunks(32) {
        out.push_str(&hex::encode(line));
        out.push('\n');
    }
    out
}

#[test]
fn encoded_bytes_of_every_message_type() {
    for (name, message) in samples::all() {
        let bytes = encode(&message);
        assert_eq!(decode(&bytes).unwrap(), message, "{name}");
        insta::assert_snapshot!(name, hex_lines(&bytes));
    }
}
