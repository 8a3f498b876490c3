//! Property tests: every valid message survives encode → decode unchanged, bit for bit, directly and
//! through frames; arbitrary bytes never panic the decoder.

use daisy_wire::{Message, Reassembler, decode, decode_for, encode, encode_frames};
use proptest::prelude::*;

use crate::samples;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_message_round_trips(message in samples::message()) {
        let bytes = encode(&message);
        let back = decode(&bytes).unwrap();
        // `PartialEq` on f32 equates -0 and +0; the re-encoded bytes compare the exact bits.
        prop_assert_eq!(&back, &message);
        prop_assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn every_message_round_trips_through_frames(message in samples::message(), id in any::<u64>()) {
        let frames = encode_frames(id, &message).unwrap();
        let mut r = Reassembler::default();
        let mut out = None;
        for (i, f) in frames.iter().enumerate() {
            let got = r.push(f).unwrap();
            prop_assert_eq!(got.is_some(), i + 1 == frames.len());
            out = got.or(out);
        }
        prop_assert_eq!(decode(&out.unwrap()).unwrap(), message);
        prop_assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        let _ = Reassembler::default().push(&bytes);
    }

    #[test]
    fn one_flipped_bit_is_refused_or_changes_the_message(
        index in 0usize..12,
        bit in 0usize..1_000_000,
    ) {
        let (_, message) = &samples::all()[index];
        let mut bytes = encode(message);
        let bit = bit % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        // A flip may produce another valid message (a different seed), never the same one, and it
        // never reaches an activation's payload unnoticed.
        if let Ok(other) = decode(&bytes) {
            prop_assert_ne!(encode(&other), encode(message));
            prop_assert!(!matches!(other, Message::Activation(_)) || !matches!(message, Message::Activation(_)));
        }
    }
}

#[test]
fn large_activation_round_trips_through_many_frames() {
    let rows = 64;
    let cols = 2048;
    let data: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let message = Message::Activation(samples::activation(data, cols));
    let frames = encode_frames(9, &message).unwrap();
    assert!(frames.len() > 8, "{} frames", frames.len());
    assert!(
        frames
            .iter()
            .all(|f| f.len() <= daisy_wire::MAX_FRAME_BYTES)
    );
    let mut r = Reassembler::default();
    // Out of order is fine: the index places each frame.
    let mut out = None;
    for f in frames.iter().rev() {
        out = r.push(f).unwrap().or(out);
    }
    let bytes = out.unwrap();
    assert_eq!(decode_for(&bytes, &samples::fp(0xab)).unwrap(), message);
}
