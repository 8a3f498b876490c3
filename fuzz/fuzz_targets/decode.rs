//! Fuzz target: arbitrary bytes into the wire decoder, the frame parser and the reassembler. Nothing
//! may panic; whatever decodes must re-encode to a message that decodes to itself.
#![no_main]

use daisy_wire::{Fingerprint, Frame, Reassembler, decode, decode_for, encode, split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = decode(data) {
        let bytes = encode(&message);
        let again = decode(&bytes).expect("a decoded message re-encodes to valid bytes");
        assert_eq!(again, message);
        assert_eq!(encode(&again), bytes);
    }
    let _ = decode_for(data, &Fingerprint([0xab; 32]));
    let _ = Frame::parse(data);

    // The input as a stream of frames, each prefixed by a little-endian u16 length, into a
    // reassembler with small bounds; every completed message goes to the decoder.
    let mut r = Reassembler::new(1 << 20, 3);
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (frame, tail) = rest[2..].split_at(len);
        if let Ok(Some(message)) = r.push(frame) {
            let _ = decode(&message);
        }
        rest = tail;
    }

    // Valid frames of the input reassemble to the input, in any order.
    let frames = split(7, data).expect("small inputs split");
    let mut r = Reassembler::default();
    let mut out = None;
    for f in frames.iter().rev() {
        out = r
            .push(&f.to_bytes())
            .expect("valid frames are accepted")
            .or(out);
    }
    assert_eq!(out.as_deref(), Some(data));
});
