//! Integration tests of `daisy-wire`: round trips, snapshots of the encoded bytes, and refusals.

mod frames;
mod refusals;
mod repo_ids;
mod roundtrip;
mod samples;
mod snapshots;
