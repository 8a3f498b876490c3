//! Framing refusals: a truncated frame, an oversized reassembly, inconsistent counts, duplicates and
//! too many messages in flight.

use daisy_wire::{
    Error, FRAME_HEADER_BYTES, Frame, MAX_FRAME_BYTES, MAX_FRAME_PAYLOAD, Reassembler, split,
};

fn message(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn frame_bytes(id: u64, len: usize) -> Vec<Vec<u8>> {
    split(id, &message(len))
        .unwrap()
        .iter()
        .map(Frame::to_bytes)
        .collect()
}

#[test]
fn sizes_at_the_frame_boundary() {
    for len in [
        0,
        1,
        MAX_FRAME_PAYLOAD - 1,
        MAX_FRAME_PAYLOAD,
        MAX_FRAME_PAYLOAD + 1,
        3 * MAX_FRAME_PAYLOAD,
    ] {
        let frames = frame_bytes(1, len);
        assert_eq!(
            frames.len(),
            len.div_ceil(MAX_FRAME_PAYLOAD).max(1),
            "len {len}"
        );
        assert!(frames.iter().all(|f| f.len() <= MAX_FRAME_BYTES));
        let mut r = Reassembler::default();
        let mut out = None;
        for f in &frames {
            out = r.push(f).unwrap().or(out);
        }
        assert_eq!(out.unwrap(), message(len), "len {len}");
    }
}

#[test]
fn truncated_frame_is_refused() {
    let frames = frame_bytes(5, 2 * MAX_FRAME_PAYLOAD + 10);
    let mut r = Reassembler::default();
    assert_eq!(r.push(&frames[0]).unwrap(), None);
    let cut = &frames[1][..frames[1].len() - 1];
    assert_eq!(
        r.push(cut),
        Err(Error::FrameTruncated {
            len: MAX_FRAME_BYTES - 1,
            expected: MAX_FRAME_BYTES
        })
    );
    // The message is dropped: its earlier frame is gone.
    assert_eq!(r.in_flight(), 0);
    // A header cut short, and the last frame cut short.
    assert_eq!(
        Reassembler::default().push(&frames[0][..FRAME_HEADER_BYTES - 1]),
        Err(Error::FrameTruncated {
            len: FRAME_HEADER_BYTES - 1,
            expected: FRAME_HEADER_BYTES
        })
    );
    let last = &frames[2];
    assert!(matches!(
        Reassembler::default().push(&last[..last.len() - 3]),
        Err(Error::FrameTruncated { .. })
    ));
}

#[test]
fn oversized_reassembly_is_refused() {
    let limit = 3 * MAX_FRAME_PAYLOAD as u64;
    let mut r = Reassembler::new(limit, 4);
    let fits = frame_bytes(1, limit as usize);
    let mut out = None;
    for f in &fits {
        out = r.push(f).unwrap().or(out);
    }
    assert_eq!(out.map(|m| m.len()), Some(limit as usize));
    let too_big = frame_bytes(2, limit as usize + 1);
    assert_eq!(
        r.push(&too_big[0]),
        Err(Error::Oversized {
            len: limit + 1,
            limit
        })
    );
    // A forged header claiming a huge total is refused before anything is held.
    let mut forged = fits[0].clone();
    forged[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        r.push(&forged),
        Err(Error::Oversized {
            len: u64::MAX,
            limit
        })
    );
    assert_eq!(r.in_flight(), 0);
}

#[test]
fn inconsistent_counts_are_refused() {
    let frames = frame_bytes(3, 2 * MAX_FRAME_PAYLOAD + 1);
    // A count that does not follow from the total length.
    let mut b = frames[0].clone();
    b[12..16].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        Reassembler::default().push(&b),
        Err(Error::FrameInconsistent { .. })
    ));
    // An index past the count.
    let mut b = frames[0].clone();
    b[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert!(matches!(
        Reassembler::default().push(&b),
        Err(Error::FrameInconsistent { .. })
    ));
    // Count zero.
    let mut b = frames[0].clone();
    b[8..16].copy_from_slice(&[0; 8]);
    assert!(matches!(
        Reassembler::default().push(&b),
        Err(Error::FrameInconsistent { .. })
    ));
    // A later frame of the same message that disagrees on the total (and so on the count).
    let other = frame_bytes(3, 3 * MAX_FRAME_PAYLOAD + 1);
    let mut r = Reassembler::default();
    assert_eq!(r.push(&frames[0]).unwrap(), None);
    assert!(matches!(
        r.push(&other[1]),
        Err(Error::FrameInconsistent { message_id: 3, .. })
    ));
    assert_eq!(r.in_flight(), 0);
    // A frame carrying more than its share.
    let mut b = frames[2].clone();
    b.push(0);
    assert!(matches!(
        Reassembler::default().push(&b),
        Err(Error::FrameInconsistent { .. })
    ));
    // The same frame twice.
    let mut r = Reassembler::default();
    assert_eq!(r.push(&frames[1]).unwrap(), None);
    assert!(matches!(
        r.push(&frames[1]),
        Err(Error::FrameInconsistent { .. })
    ));
}

#[test]
fn frames_over_the_channel_limit_are_refused() {
    let mut b = frame_bytes(1, 2 * MAX_FRAME_PAYLOAD)[0].clone();
    b.push(0);
    assert_eq!(
        Reassembler::default().push(&b),
        Err(Error::FrameTooLarge {
            len: MAX_FRAME_BYTES + 1,
            limit: MAX_FRAME_BYTES
        })
    );
}

#[test]
fn too_many_messages_in_flight_are_refused() {
    let mut r = Reassembler::new(1 << 30, 2);
    for id in 0..2 {
        assert_eq!(
            r.push(&frame_bytes(id, 2 * MAX_FRAME_PAYLOAD)[0]).unwrap(),
            None
        );
    }
    assert_eq!(
        r.push(&frame_bytes(9, 2 * MAX_FRAME_PAYLOAD)[0]),
        Err(Error::TooManyInFlight { limit: 2 })
    );
    // One-frame messages need no slot.
    assert_eq!(r.push(&frame_bytes(10, 5)[0]).unwrap(), Some(message(5)));
    r.discard(0);
    assert_eq!(
        r.push(&frame_bytes(9, 2 * MAX_FRAME_PAYLOAD)[0]).unwrap(),
        None
    );
}
