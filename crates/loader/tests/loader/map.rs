//! A local file's byte range memory-mapped: the bytes a positional read gives, past-the-end ranges
//! refused, pages given back and read again unchanged; the checkpoint maps a stored tensor and
//! declines one it must transform.

use daisy_loader::{ByteSource, Checkpoint, FileSource};

use crate::root;

#[test]
fn a_mapped_range_holds_the_bytes_a_read_gives() {
    let path = root().join("fixtures/tiny/llama/model.safetensors");
    let src = FileSource::open(&path).unwrap();
    let len = src.len().unwrap();
    // An offset off any page boundary and a range across several pages.
    let (offset, n) = (4099u64, 3 * 4096 + 17);
    let read = src.read_at(offset, n).unwrap();
    let map = src.map(offset, n).expect("a local file maps").unwrap();
    assert_eq!(map.bytes(), &read[..]);
    map.release(100..9000);
    assert_eq!(map.bytes(), &read[..], "released pages read back the same");
    let e = src.map(len - 3, 4).expect("a local file maps").unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");

    let ck = Checkpoint::open(&root().join("fixtures/tiny/llama").to_string_lossy()).unwrap();
    let name = "model.embed_tokens.weight";
    let (dtype, mapped) = ck
        .map_raw(name)
        .unwrap()
        .expect("a safetensors tensor maps");
    let (read_dtype, bytes) = ck.read_raw(name).unwrap();
    assert_eq!((dtype, mapped.bytes()), (read_dtype, &bytes[..]));
    // The mutation: another tensor's bytes are not these.
    let (_, other) = ck.map_raw("lm_head.weight").unwrap().unwrap();
    assert_ne!(other.bytes(), &bytes[..]);
}

#[test]
fn a_mapped_range_reads_its_own_bytes_through_the_file() {
    let path = root().join("fixtures/tiny/llama/model.safetensors");
    let src = FileSource::open(&path).unwrap();
    // A mapping that starts off a page boundary: a read at `at` is the file's byte `offset + at`.
    let (offset, n) = (4099u64, 3 * 4096 + 17);
    let map = src.map(offset, n).expect("a local file maps").unwrap();
    for (at, len) in [(0usize, 16usize), (1000, 1152), (n - 7, 7)] {
        let mut out = vec![0u8; len];
        map.read_at(at, &mut out).unwrap();
        assert_eq!(out, map.bytes()[at..at + len], "at {at}");
        assert_eq!(
            out,
            src.read_at(offset + at as u64, len).unwrap(),
            "at {at}"
        );
        // The mutation: the same offset in the file, not in the mapping, is other bytes.
        assert_ne!(out, src.read_at(at as u64, len).unwrap(), "at {at}");
    }
    // Past the mapping's end (the file goes on) is refused, naming the file.
    let mut out = vec![0u8; 8];
    let e = map.read_at(n - 7, &mut out).unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert!(map.read_at(usize::MAX, &mut out).is_err());
}
