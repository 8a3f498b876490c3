//! Framing: a message larger than a data channel's 64 KiB limit travels as several frames, and a
//! [`Reassembler`] puts them back together under a bound on the message size and on the number of
//! messages in flight.
//!
//! A frame is a 24-byte header — message id (u64), index (u32), count (u32), total message length
//! (u64), all little-endian — followed by its slice of the message. Every frame but the last carries
//! exactly [`MAX_FRAME_PAYLOAD`] bytes, so the count and each frame's length follow from the total
//! length, and a frame that disagrees is refused.

use std::collections::BTreeMap;

use crate::{Error, Message, encode};

/// Largest frame, header included: a WebRTC data channel's message limit.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;
/// Size of the frame header.
pub const FRAME_HEADER_BYTES: usize = 24;
/// Message bytes in every frame but the last.
pub const MAX_FRAME_PAYLOAD: usize = MAX_FRAME_BYTES - FRAME_HEADER_BYTES;
/// Default bound on one reassembled message (a 4096-row window of 4096-wide f32 hidden states is 64 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 256 * 1024 * 1024;
/// Default bound on messages being reassembled at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// One frame of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub message_id: u64,
    pub index: u32,
    pub count: u32,
    pub total_len: u64,
    pub payload: Vec<u8>,
}

/// Frames needed for a message of `total_len` bytes (an empty message still takes one frame).
fn frames_for(total_len: u64) -> u64 {
    total_len.div_ceil(MAX_FRAME_PAYLOAD as u64).max(1)
}

/// Payload length frame `index` of a `count`-frame message of `total_len` bytes must carry.
fn payload_len(index: u32, count: u32, total_len: u64) -> u64 {
    if index + 1 < count {
        MAX_FRAME_PAYLOAD as u64
    } else {
        total_len - (u64::from(count) - 1) * MAX_FRAME_PAYLOAD as u64
    }
}

impl Frame {
    /// Header then payload.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + self.payload.len());
        out.extend_from_slice(&self.message_id.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.total_len.to_le_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Reads the header only: `(message_id, index, count, total_len)`.
    fn header(bytes: &[u8]) -> Result<(u64, u32, u32, u64), Error> {
        let Some(h) = bytes.get(..FRAME_HEADER_BYTES) else {
            return Err(Error::FrameTruncated {
                len: bytes.len(),
                expected: FRAME_HEADER_BYTES,
            });
        };
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or_default());
        Ok((u64_at(0), u32_at(8), u32_at(12), u64_at(16)))
    }

    /// Parses and checks one frame: a whole header, `index < count`, `count` and the payload length
    /// consistent with the total length, at most [`MAX_FRAME_BYTES`] in all.
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        let (message_id, index, count, total_len) = Self::header(bytes)?;
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(Error::FrameTooLarge {
                len: bytes.len(),
                limit: MAX_FRAME_BYTES,
            });
        }
        if index >= count {
            return Err(Error::FrameInconsistent {
                message_id,
                reason: format!("frame index {index} is not below the frame count {count}"),
            });
        }
        let expected_count = frames_for(total_len);
        if u64::from(count) != expected_count {
            return Err(Error::FrameInconsistent {
                message_id,
                reason: format!(
                    "{count} frames for a {total_len}-byte message, expected {expected_count}"
                ),
            });
        }
        let expected_len = payload_len(index, count, total_len);
        let got = (bytes.len() - FRAME_HEADER_BYTES) as u64;
        if got < expected_len {
            return Err(Error::FrameTruncated {
                len: bytes.len(),
                expected: FRAME_HEADER_BYTES + expected_len as usize,
            });
        }
        if got > expected_len {
            return Err(Error::FrameInconsistent {
                message_id,
                reason: format!("frame {index} carries {got} bytes, expected {expected_len}"),
            });
        }
        Ok(Self {
            message_id,
            index,
            count,
            total_len,
            payload: bytes[FRAME_HEADER_BYTES..].to_vec(),
        })
    }
}

/// Splits encoded message bytes into frames of at most [`MAX_FRAME_BYTES`].
pub fn split(message_id: u64, message: &[u8]) -> Result<Vec<Frame>, Error> {
    let total_len = message.len() as u64;
    let count = u32::try_from(frames_for(total_len)).map_err(|_| Error::Oversized {
        len: total_len,
        limit: u64::from(u32::MAX) * MAX_FRAME_PAYLOAD as u64,
    })?;
    if message.is_empty() {
        return Ok(vec![Frame {
            message_id,
            index: 0,
            count,
            total_len,
            payload: Vec::new(),
        }]);
    }
    Ok(message
        .chunks(MAX_FRAME_PAYLOAD)
        .enumerate()
        .map(|(i, chunk)| Frame {
            message_id,
            index: i as u32,
            count,
            total_len,
            payload: chunk.to_vec(),
        })
        .collect())
}

/// Encodes `message` and splits it into frame bytes ready to send.
pub fn encode_frames(message_id: u64, message: &Message) -> Result<Vec<Vec<u8>>, Error> {
    Ok(split(message_id, &encode(message))?
        .iter()
        .map(Frame::to_bytes)
        .collect())
}

#[derive(Debug)]
struct Pending {
    count: u32,
    total_len: u64,
    received: u32,
    chunks: Vec<Option<Vec<u8>>>,
}

/// Puts frames back together. Refuses a frame that is truncated or inconsistent with the others of
/// its message, a message larger than the bound, and a new message when too many are in flight. A
/// refused frame drops whatever had been gathered of its message.
#[derive(Debug)]
pub struct Reassembler {
    max_message_bytes: u64,
    max_in_flight: usize,
    pending: BTreeMap<u64, Pending>,
}

impl Default for Reassembler {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_IN_FLIGHT)
    }
}

impl Reassembler {
    /// A reassembler that accepts messages of at most `max_message_bytes` and holds at most
    /// `max_in_flight` incomplete messages.
    pub fn new(max_message_bytes: u64, max_in_flight: usize) -> Self {
        Self {
            max_message_bytes,
            max_in_flight,
            pending: BTreeMap::new(),
        }
    }

    /// Incomplete messages held now.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Forgets an incomplete message (a cancelled turn, a timeout).
    pub fn discard(&mut self, message_id: u64) {
        self.pending.remove(&message_id);
    }

    /// Takes one frame's bytes; returns the whole message once its last frame has arrived.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let result = self.push_inner(bytes);
        if result.is_err()
            && let Ok((id, ..)) = Frame::header(bytes)
        {
            self.pending.remove(&id);
        }
        result
    }

    fn push_inner(&mut self, bytes: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let (_, _, _, total_len) = Frame::header(bytes)?;
        if total_len > self.max_message_bytes {
            return Err(Error::Oversized {
                len: total_len,
                limit: self.max_message_bytes,
            });
        }
        let frame = Frame::parse(bytes)?;
        if frame.count == 1 {
            if self.pending.contains_key(&frame.message_id) {
                return Err(Error::FrameInconsistent {
                    message_id: frame.message_id,
                    reason: "a one-frame message reuses the id of one in flight".into(),
                });
            }
            return Ok(Some(frame.payload));
        }
        if !self.pending.contains_key(&frame.message_id) && self.pending.len() >= self.max_in_flight
        {
            return Err(Error::TooManyInFlight {
                limit: self.max_in_flight,
            });
        }
        let pending = self
            .pending
            .entry(frame.message_id)
            .or_insert_with(|| Pending {
                count: frame.count,
                total_len: frame.total_len,
                received: 0,
                chunks: vec![None; frame.count as usize],
            });
        if pending.count != frame.count || pending.total_len != frame.total_len {
            return Err(Error::FrameInconsistent {
                message_id: frame.message_id,
                reason: format!(
                    "frame {} says {} frames and {} bytes, earlier frames said {} and {}",
                    frame.index, frame.count, frame.total_len, pending.count, pending.total_len
                ),
            });
        }
        let slot = &mut pending.chunks[frame.index as usize];
        if slot.is_some() {
            return Err(Error::FrameInconsistent {
                message_id: frame.message_id,
                reason: format!("frame {} arrived twice", frame.index),
            });
        }
        *slot = Some(frame.payload);
        pending.received += 1;
        if pending.received < pending.count {
            return Ok(None);
        }
        let Some(done) = self.pending.remove(&frame.message_id) else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(done.total_len as usize);
        for chunk in done.chunks.into_iter().flatten() {
            out.extend_from_slice(&chunk);
        }
        Ok(Some(out))
    }
}
