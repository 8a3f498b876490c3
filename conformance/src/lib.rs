//! Conformance: replays real model splits against independent goldens, and mutation cases that must fail.
